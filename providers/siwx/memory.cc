// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Protection domains and memory regions: verbs objects over the context's
// engine::MemoryTable (STags, access rights, bounds; see memory.h there).
//
// Access flags: rdma-core passes LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ,
// REMOTE_ATOMIC, MW_BIND, ZERO_BASED, ON_DEMAND, HUGETLB and the optional
// range (bits 20..29, e.g. RELAXED_ORDERING). The first six go to the engine,
// whose AccessFlags have the same values. HUGETLB is a hint and the optional
// flags may be ignored by definition; both are accepted and dropped. ON_DEMAND
// fails with EOPNOTSUPP, as on kernel devices without ODP. Any other bit, or
// remote write or atomic without local write, is EINVAL (the kernel's
// ib_check_mr_access rules).
//
// Memory is not pinned: the engine copies from and to the application's
// virtual addresses. Registration checks that the range is mapped now, and
// readable, and writable when the access lets anyone write it (EFAULT
// otherwise, as the kernel's page pinning; memory_map.h). Unmapping it or
// changing its protection while it is registered is the application's error.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <optional>

#include "common/engine/access.h"
#include "common/util/log.h"
#include "providers/siwx/memory_map.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

static_assert(static_cast<int>(engine::AccessFlags::kLocalWrite) == IBV_ACCESS_LOCAL_WRITE);
static_assert(static_cast<int>(engine::AccessFlags::kRemoteWrite) == IBV_ACCESS_REMOTE_WRITE);
static_assert(static_cast<int>(engine::AccessFlags::kRemoteRead) == IBV_ACCESS_REMOTE_READ);
static_assert(static_cast<int>(engine::AccessFlags::kRemoteAtomic) == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(static_cast<int>(engine::AccessFlags::kMwBind) == IBV_ACCESS_MW_BIND);
static_assert(static_cast<int>(engine::AccessFlags::kZeroBased) == IBV_ACCESS_ZERO_BASED);

constexpr unsigned int kEngineAccessBits =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED;
constexpr unsigned int kIgnoredAccessBits =
    static_cast<unsigned int>(IBV_ACCESS_HUGETLB) | static_cast<unsigned int>(IBV_ACCESS_OPTIONAL_RANGE);

// 0, or the errno a registration with these flags fails with.
int CheckAccess(unsigned int access) {
  if ((access & ~(kEngineAccessBits | kIgnoredAccessBits | IBV_ACCESS_ON_DEMAND)) != 0) {
    return EINVAL;
  }
  if ((access & IBV_ACCESS_ON_DEMAND) != 0) return EOPNOTSUPP;
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
      (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
    return EINVAL;
  }
  return 0;
}

// Accesses that let someone write the memory; the kernel pins such a
// registration for writing (ib_access_writable's set: a window bind may
// grant write too).
constexpr unsigned int kWritingAccessBits = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                            IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;

// True if every page of [addr, addr + length) is mapped (mincore fails with
// ENOMEM on an unmapped page). length > 0 and the range does not wrap. The
// fallback when /proc/self/maps cannot be read: it cannot see permissions.
bool RangeIsMapped(std::uintptr_t addr, std::size_t length) {
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::uintptr_t begin = addr & ~(page - 1);
  const std::uintptr_t end = addr + length;  // exclusive
  unsigned char residency[4096];
  while (begin < end) {
    const std::uintptr_t pages_left = (end - begin + page - 1) / page;
    const std::uintptr_t pages = pages_left < sizeof(residency) ? pages_left : sizeof(residency);
    if (::mincore(reinterpret_cast<void*>(begin), pages * page, residency) != 0) {
      if (errno == ENOMEM) return false;
      return true;  // EAGAIN and friends say nothing about the mapping
    }
    begin += pages * page;
  }
  return true;
}

}  // namespace

ibv_pd* AllocPd(ibv_context* ibctx) noexcept {
  Context* context = ToSiwx(ibctx);
  Device* device = context->state->device;
  if (!TakeBudget(device->pd_count, DeviceLimits::kMaxPd)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* pd = new (std::nothrow) Pd();
  engine::PdId id = engine::kNoPd;
  if (pd != nullptr) {
    try {
      id = context->state->memory().AllocatePd();
    } catch (...) {
      id = engine::kNoPd;
    }
  }
  if (id == engine::kNoPd) {
    delete pd;
    ReturnBudget(device->pd_count);
    errno = ENOMEM;
    return nullptr;
  }
  pd->id = id;
  pd->base.handle = id;
  return &pd->base;  // libibverbs sets pd->context
}

int DeallocPd(ibv_pd* ibpd) noexcept {
  Pd* pd = ToSiwx(ibpd);
  Context* context = ToSiwx(ibpd->context);
  if (Inherited(context)) return 0;  // forgotten (provider.h, fork())
  if (pd->users.load() != 0) return EBUSY;  // SRQs or QPs still in it
  engine::PdStatus status;
  try {
    status = context->state->memory().DeallocatePd(pd->id);
  } catch (...) {
    return ENOMEM;
  }
  switch (status) {
    case engine::PdStatus::kOk:
      break;
    case engine::PdStatus::kBusy:
      return EBUSY;  // memory regions still registered in it
    case engine::PdStatus::kInvalidPd:
      return EINVAL;
  }
  ReturnBudget(context->state->device->pd_count);
  delete pd;
  return 0;
}

ibv_mr* RegMr(ibv_pd* ibpd, void* addr, std::size_t length, std::uint64_t iova,
              int access) noexcept {
  const unsigned int flags = static_cast<unsigned int>(access);
  if (int error = CheckAccess(flags); error != 0) {
    errno = error;
    return nullptr;
  }
  const auto host = reinterpret_cast<std::uintptr_t>(addr);
  if (length == 0 || host + length < host) {
    errno = EINVAL;
    return nullptr;
  }
  const std::optional<RangeAccess> range =
      QueryRangeAccess(host, length, (flags & kWritingAccessBits) != 0);
  if (range ? *range != RangeAccess::kOk : !RangeIsMapped(host, length)) {
    errno = EFAULT;
    return nullptr;
  }
  Pd* pd = ToSiwx(ibpd);
  Context* context = ToSiwx(ibpd->context);
  auto* mr = new (std::nothrow) pabi::verbs_mr();
  if (mr == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  engine::RegisterResult result;
  try {
    result = context->state->memory().Register(
        pd->id, iova, length, host, static_cast<engine::AccessFlags>(flags & kEngineAccessBits));
  } catch (...) {
    result.status = engine::RegisterStatus::kNoResources;
  }
  int error = 0;
  switch (result.status) {
    case engine::RegisterStatus::kOk:
      break;
    case engine::RegisterStatus::kInvalidPd:
    case engine::RegisterStatus::kInvalidAccess:
    case engine::RegisterStatus::kInvalidLength:
      error = EINVAL;
      break;
    case engine::RegisterStatus::kNoResources:
      error = ENOMEM;
      break;
    case engine::RegisterStatus::kNoRandomness:
      SIWX_LOG(kError, "memory registration refused: getrandom(2) failed, so no "
                       "unpredictable STag key is available; allow getrandom in the "
                       "process's seccomp policy");
      error = ENOMEM;
      break;
  }
  if (error != 0) {
    delete mr;
    errno = error;
    return nullptr;
  }
  // lkey == rkey: one STag names the region locally and remotely.
  mr->mr.lkey = result.stag;
  mr->mr.rkey = result.stag;
  mr->mr.handle = engine::StagIndex(result.stag);
  mr->mr_type = pabi::kMrTypeMr;
  mr->access = access;
  return &mr->mr;  // libibverbs sets context, pd, addr, length
}

int DeregMr(pabi::verbs_mr* vmr) noexcept {
  Context* context = ToSiwx(vmr->mr.context);
  if (Inherited(context)) return 0;  // forgotten (provider.h, fork())
  engine::DeregisterStatus status;
  try {
    status = context->state->memory().Deregister(vmr->mr.lkey);
  } catch (...) {
    return ENOMEM;
  }
  if (status != engine::DeregisterStatus::kOk) return EINVAL;
  delete vmr;
  return 0;
}

}  // namespace siwx::provider
