// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// STag table, PDs and the tagged-access check (RFC 5040/5041 tagged buffers,
// RFC 5042 sections 2.2.4, 2.2.5, 6.1.1, 6.2.1, 6.3.5, 6.4.5).
#include "common/engine/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace siwx::engine {
namespace {

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();
constexpr AccessFlags kLocalWrite = AccessFlags::kLocalWrite;
constexpr AccessFlags kRemoteWrite = AccessFlags::kRemoteWrite;
constexpr AccessFlags kRemoteRead = AccessFlags::kRemoteRead;
constexpr AccessFlags kRw = kLocalWrite | kRemoteWrite;

// Keys from a fixed list, so tests can pin exact STag values.
MemoryTable::KeySource Keys(std::vector<std::uint8_t> keys) {
  auto state = std::make_shared<std::pair<std::vector<std::uint8_t>, std::size_t>>(
      std::move(keys), 0);
  return [state]() -> std::optional<std::uint8_t> {
    const std::uint8_t k = state->first[state->second % state->first.size()];
    ++state->second;
    return k;
  };
}

// Indices from a fixed list (cycled), so tests can pin exact STag values.
MemoryTable::IndexSource Indices(std::vector<std::uint32_t> indices) {
  auto state = std::make_shared<std::pair<std::vector<std::uint32_t>, std::size_t>>(
      std::move(indices), 0);
  return [state]() -> std::optional<std::uint32_t> {
    const std::uint32_t i = state->first[state->second % state->first.size()];
    ++state->second;
    return i;
  };
}

// Indices 1, 2, 3, ...
MemoryTable::IndexSource Sequential() {
  auto next = std::make_shared<std::uint32_t>(0);
  return [next]() -> std::optional<std::uint32_t> { return ++*next; };
}

MemoryTable::Options Opts(std::vector<std::uint8_t> keys, std::uint32_t reuse_delay = 0,
                          std::uint32_t max_regions = 1u << 20) {
  MemoryTable::Options o;
  o.key_source = Keys(std::move(keys));
  o.index_source = Sequential();
  o.reuse_delay = reuse_delay;
  o.max_regions = max_regions;
  return o;
}

std::uintptr_t Addr(const std::vector<std::uint8_t>& buf) {
  return reinterpret_cast<std::uintptr_t>(buf.data());
}

TEST(StagFormat, IndexIsHigh24BitsKeyIsLow8) {
  EXPECT_EQ(MakeStag(0xABCDEF, 0x12), 0xABCDEF12u);
  EXPECT_EQ(StagIndex(0xABCDEF12u), 0xABCDEFu);
  EXPECT_EQ(StagKey(0xABCDEF12u), 0x12u);
  EXPECT_EQ(MakeStag(1, 0x00), 0x00000100u);
  EXPECT_EQ(kMaxStagIndex, 0x00FFFFFFu);
}

TEST(ProtectionDomain, IdsCountFromOneAndAreNotReused) {
  MemoryTable table(Opts({0x11}));
  const PdId a = table.AllocatePd();
  const PdId b = table.AllocatePd();
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(table.DeallocatePd(a), PdStatus::kOk);
  EXPECT_EQ(table.DeallocatePd(a), PdStatus::kInvalidPd);
  EXPECT_EQ(table.AllocatePd(), 3u);
  EXPECT_EQ(table.DeallocatePd(kNoPd), PdStatus::kInvalidPd);
  EXPECT_EQ(table.DeallocatePd(99), PdStatus::kInvalidPd);
}

TEST(ProtectionDomain, BusyWhileRegionsRemain) {
  MemoryTable table(Opts({0x11}));
  std::vector<std::uint8_t> buf(64);
  const PdId pd = table.AllocatePd();
  const RegisterResult r = table.Register(pd, Addr(buf), buf.size(), Addr(buf), kLocalWrite);
  ASSERT_EQ(r.status, RegisterStatus::kOk);
  EXPECT_EQ(table.DeallocatePd(pd), PdStatus::kBusy);
  EXPECT_EQ(table.Deregister(r.stag), DeregisterStatus::kOk);
  EXPECT_EQ(table.DeallocatePd(pd), PdStatus::kOk);
}

TEST(Register, FirstStagsArePinnedByIndexAndKey) {
  MemoryTable table(Opts({0x5A, 0xC3}));
  std::vector<std::uint8_t> buf(64);
  const PdId pd = table.AllocatePd();
  const RegisterResult r1 = table.Register(pd, 0x1000, 64, Addr(buf), kLocalWrite);
  const RegisterResult r2 = table.Register(pd, 0x2000, 64, Addr(buf), kLocalWrite);
  EXPECT_EQ(r1.status, RegisterStatus::kOk);
  EXPECT_EQ(r1.stag, 0x0000015Au);  // index 1 (index 0 is never used), key 0x5A
  EXPECT_EQ(r2.status, RegisterStatus::kOk);
  EXPECT_EQ(r2.stag, 0x000002C3u);  // index 2, key 0xC3
  EXPECT_EQ(table.region_count(), 2u);
}

TEST(Register, RejectsBadArguments) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(64);
  const PdId pd = table.AllocatePd();
  const std::uintptr_t host = Addr(buf);
  struct Case {
    PdId pd;
    std::uint64_t iova;
    std::uint64_t length;
    std::uintptr_t host;
    AccessFlags access;
    RegisterStatus want;
  };
  const Case cases[] = {
      {pd + 1, 0, 64, host, kLocalWrite, RegisterStatus::kInvalidPd},   // not allocated
      {kNoPd, 0, 64, host, kLocalWrite, RegisterStatus::kInvalidPd},
      {pd, 0, 64, host, static_cast<AccessFlags>(1u << 6), RegisterStatus::kInvalidAccess},
      {pd, 0, 64, host, kRemoteWrite, RegisterStatus::kInvalidAccess},  // needs local write
      {pd, 0, 64, host, AccessFlags::kRemoteAtomic, RegisterStatus::kInvalidAccess},
      {pd, 0, 0, host, kLocalWrite, RegisterStatus::kInvalidLength},
      {pd, kU64Max, 2, host, kLocalWrite, RegisterStatus::kInvalidLength},  // IOVA range wraps
      {pd, 0, 2, std::numeric_limits<std::uintptr_t>::max(), kLocalWrite,
       RegisterStatus::kInvalidLength},                                    // host range wraps
      {pd, kU64Max, 1, host, kLocalWrite, RegisterStatus::kOk},            // last octet, no wrap
      {pd, kU64Max, 64, host, kLocalWrite | AccessFlags::kZeroBased, RegisterStatus::kOk},
      {pd, 0, 64, host, kRemoteRead, RegisterStatus::kOk},  // remote read alone is fine
      {pd, 0, 64, host, AccessFlags::kNone, RegisterStatus::kOk},
  };
  for (const Case& c : cases) {
    const RegisterResult r = table.Register(c.pd, c.iova, c.length, c.host, c.access);
    EXPECT_EQ(r.status, c.want) << "iova " << c.iova << " length " << c.length;
    if (c.want != RegisterStatus::kOk) {
      EXPECT_EQ(r.stag, 0u);
    }
  }
  EXPECT_EQ(table.region_count(), 4u);
}

TEST(Register, NoRandomnessFailsWithoutARegion) {
  MemoryTable::Options o;
  bool available = false;
  o.key_source = [&available]() -> std::optional<std::uint8_t> {
    if (!available) return std::nullopt;
    return 0x77;
  };
  MemoryTable table(std::move(o));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  EXPECT_EQ(table.Register(pd, 0, 8, Addr(buf), kLocalWrite).status, RegisterStatus::kNoRandomness);
  EXPECT_EQ(table.region_count(), 0u);
  available = true;
  const RegisterResult r = table.Register(pd, 0, 8, Addr(buf), kLocalWrite);
  EXPECT_EQ(r.status, RegisterStatus::kOk);
  EXPECT_EQ(StagKey(r.stag), 0x77u);

  MemoryTable::Options no_index;
  no_index.index_source = []() -> std::optional<std::uint32_t> { return std::nullopt; };
  MemoryTable table2(std::move(no_index));
  const PdId pd2 = table2.AllocatePd();
  EXPECT_EQ(table2.Register(pd2, 0, 8, Addr(buf), kLocalWrite).status,
            RegisterStatus::kNoRandomness);
  EXPECT_EQ(table2.region_count(), 0u);
}

TEST(Register, FreedIndexIsNotReissuedWithinTheReuseDelay) {
  // The source offers index 1 again at once: it is skipped while among the
  // last two freed, and may come back once two more have been freed.
  MemoryTable::Options o = Opts({0x10, 0x20, 0x30, 0x40, 0x50}, /*reuse_delay=*/2);
  o.index_source = Indices({1, 2, 1, 3, 2, 1});
  MemoryTable t(std::move(o));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = t.AllocatePd();
  auto reg = [&] { return t.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag; };
  const std::uint32_t a = reg();
  const std::uint32_t b = reg();
  EXPECT_EQ(a, MakeStag(1, 0x10));
  EXPECT_EQ(b, MakeStag(2, 0x20));
  ASSERT_EQ(t.Deregister(a), DeregisterStatus::kOk);
  const std::uint32_t c = reg();  // 1 was just freed: skipped, 3 taken
  EXPECT_EQ(c, MakeStag(3, 0x30));
  ASSERT_EQ(t.Deregister(b), DeregisterStatus::kOk);
  ASSERT_EQ(t.Deregister(c), DeregisterStatus::kOk);
  const std::uint32_t d = reg();  // 2 is recent; 1 left the window
  EXPECT_EQ(d, MakeStag(1, 0x40));
  // The stale STags name nothing.
  EXPECT_EQ(t.Check(a, pd, AccessKind::kLocalRead, 0, 1).status, AccessStatus::kInvalidStag);
  EXPECT_EQ(t.Deregister(a), DeregisterStatus::kInvalidStag);
  EXPECT_EQ(t.Check(d, pd, AccessKind::kLocalRead, 0, 1).status, AccessStatus::kOk);
}

TEST(Register, IndexDrawsThatKeepHittingUsedOnesFail) {
  MemoryTable::Options o = Opts({0x10});
  o.index_source = Indices({5});
  MemoryTable table(std::move(o));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  EXPECT_EQ(table.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag, MakeStag(5, 0x10));
  EXPECT_EQ(table.Register(pd, 0, 8, Addr(buf), kLocalWrite).status, RegisterStatus::kNoResources);
  EXPECT_EQ(table.region_count(), 1u);
}

// RFC 5042 6.1.1 and RFC 5040 8.1.1 rule 8: STags "difficult to predict",
// "sparsely populate[d] ... over the full available range". With the
// CSPRNG, consecutive registrations get unrelated indices and keys, all
// distinct, spread over the 24-bit index space; a freed STag does not come
// back at the next registration.
TEST(Register, CsprngStagsAreUnpredictableAndDistinct) {
  MemoryTable table;
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  constexpr int kCount = 20000;
  std::vector<std::uint32_t> stags;
  std::set<std::uint32_t> distinct;
  std::set<std::uint8_t> keys;
  int sequential = 0;
  std::uint32_t min_index = kMaxStagIndex;
  std::uint32_t max_index = 0;
  for (int i = 0; i < kCount; ++i) {
    const RegisterResult r = table.Register(pd, 0, 8, Addr(buf), kLocalWrite);
    ASSERT_EQ(r.status, RegisterStatus::kOk);
    const std::uint32_t index = StagIndex(r.stag);
    if (!stags.empty()) {
      const std::uint32_t previous = StagIndex(stags.back());
      if (index == previous + 1 || index + 1 == previous) ++sequential;
    }
    min_index = std::min(min_index, index);
    max_index = std::max(max_index, index);
    stags.push_back(r.stag);
    distinct.insert(r.stag);
    keys.insert(StagKey(r.stag));
  }
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kCount));
  // Neighbouring indices by chance: about kCount * 2 / 2^24 = 0.002.
  EXPECT_LE(sequential, 2);
  // 20000 uniform draws from 2^24 all landing in one eighth: chance 8^-20000.
  EXPECT_LT(min_index, kMaxStagIndex / 8);
  EXPECT_GT(max_index, kMaxStagIndex / 8 * 7);
  EXPECT_EQ(keys.size(), 256u);  // all 256 keys appear (miss chance ~1e-32)
  // Every STag stays reachable in the open-addressing table.
  for (const std::uint32_t stag : stags) {
    ASSERT_EQ(table.Check(stag, pd, AccessKind::kLocalRead, 0, 8).status, AccessStatus::kOk);
  }
  // Free every other one (probe runs get holes), check the rest, then make
  // sure a freed STag is not what the next registration gets.
  for (std::size_t i = 0; i < stags.size(); i += 2) {
    ASSERT_EQ(table.Deregister(stags[i]), DeregisterStatus::kOk);
  }
  for (std::size_t i = 0; i < stags.size(); ++i) {
    ASSERT_EQ(table.Check(stags[i], pd, AccessKind::kLocalRead, 0, 8).status,
              i % 2 == 0 ? AccessStatus::kInvalidStag : AccessStatus::kOk)
        << i;
  }
  for (int i = 0; i < 2000; ++i) {
    const std::uint32_t old = table.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag;
    ASSERT_EQ(table.Deregister(old), DeregisterStatus::kOk);
    const RegisterResult next = table.Register(pd, 0, 8, Addr(buf), kLocalWrite);
    ASSERT_EQ(next.status, RegisterStatus::kOk);
    ASSERT_NE(StagIndex(next.stag), StagIndex(old)) << "registration " << i;
    ASSERT_EQ(table.Deregister(next.stag), DeregisterStatus::kOk);
  }
}

TEST(Register, FullTableRunsOut) {
  MemoryTable table(Opts({0x10, 0x20, 0x30, 0x40}, /*reuse_delay=*/100, /*max_regions=*/2));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  auto reg = [&] { return table.Register(pd, 0, 8, Addr(buf), kLocalWrite); };
  const RegisterResult a = reg();
  const RegisterResult b = reg();
  EXPECT_EQ(a.stag, MakeStag(1, 0x10));
  EXPECT_EQ(b.stag, MakeStag(2, 0x20));
  EXPECT_EQ(reg().status, RegisterStatus::kNoResources);
  ASSERT_EQ(table.Deregister(b.stag), DeregisterStatus::kOk);
  // Room again; the failed attempt drew neither an index nor a key.
  EXPECT_EQ(reg().stag, MakeStag(3, 0x30));
}

// One VA-based region: TOs [0x1000, 0x1100), rights local+remote write.
class CheckTest : public ::testing::Test {
 protected:
  CheckTest() : table_(Opts({0xA5, 0x3C})), buf_(0x100) {
    pd_ = table_.AllocatePd();
    other_pd_ = table_.AllocatePd();
    stag_ = table_.Register(pd_, 0x1000, 0x100, Addr(buf_), kRw).stag;
  }
  AccessStatus Status(std::uint64_t to, std::uint64_t len,
                      AccessKind kind = AccessKind::kRemoteWrite) {
    return table_.Check(stag_, pd_, kind, to, len).status;
  }

  MemoryTable table_;
  std::vector<std::uint8_t> buf_;
  PdId pd_ = kNoPd;
  PdId other_pd_ = kNoPd;
  std::uint32_t stag_ = 0;
};

TEST_F(CheckTest, StagIsPinned) { EXPECT_EQ(stag_, 0x000001A5u); }

TEST_F(CheckTest, WholeRegionPasses) {
  AccessCheckResult r = table_.Check(stag_, pd_, AccessKind::kRemoteWrite, 0x1000, 0x100);
  ASSERT_EQ(r.status, AccessStatus::kOk);
  ASSERT_TRUE(r.region);
  EXPECT_EQ(r.region->stag(), stag_);
  EXPECT_EQ(r.region->pd(), pd_);
  EXPECT_EQ(r.region->base_to(), 0x1000u);
  EXPECT_EQ(r.region->length(), 0x100u);
  EXPECT_EQ(r.region->HostPointer(0x1000), buf_.data());
  EXPECT_EQ(r.region->HostPointer(0x10FF), buf_.data() + 0xFF);
}

TEST_F(CheckTest, BaseAndBoundsAtEveryEdge) {
  EXPECT_EQ(Status(0x0FFF, 1), AccessStatus::kBaseOrBounds);  // one below base
  EXPECT_EQ(Status(0x0FFF, 2), AccessStatus::kBaseOrBounds);  // straddles base
  EXPECT_EQ(Status(0x1000, 1), AccessStatus::kOk);
  EXPECT_EQ(Status(0x10FF, 1), AccessStatus::kOk);            // last octet
  EXPECT_EQ(Status(0x10FF, 2), AccessStatus::kBaseOrBounds);  // one past the end
  EXPECT_EQ(Status(0x1100, 1), AccessStatus::kBaseOrBounds);
  EXPECT_EQ(Status(0x1000, 0x101), AccessStatus::kBaseOrBounds);
  EXPECT_EQ(Status(0x1001, 0xFF), AccessStatus::kOk);
  EXPECT_EQ(Status(0, kU64Max), AccessStatus::kBaseOrBounds);
}

TEST_F(CheckTest, TaggedOffsetWrap) {
  EXPECT_EQ(Status(kU64Max, 2), AccessStatus::kToWrap);       // TO + len = 2^64 + 1
  EXPECT_EQ(Status(kU64Max, 1), AccessStatus::kBaseOrBounds);  // ends at 2^64: no wrap
  EXPECT_EQ(Status(0x1000, kU64Max), AccessStatus::kToWrap);
  EXPECT_EQ(Status(1, kU64Max), AccessStatus::kBaseOrBounds);  // ends exactly at 2^64
}

TEST_F(CheckTest, AccessRights) {
  EXPECT_EQ(Status(0x1000, 4, AccessKind::kLocalRead), AccessStatus::kOk);
  EXPECT_EQ(Status(0x1000, 4, AccessKind::kLocalWrite), AccessStatus::kOk);
  EXPECT_EQ(Status(0x1000, 4, AccessKind::kRemoteWrite), AccessStatus::kOk);
  EXPECT_EQ(Status(0x1000, 4, AccessKind::kRemoteRead), AccessStatus::kAccessViolation);
}

TEST_F(CheckTest, InvalidStags) {
  const PdId pd = pd_;
  auto status = [&](std::uint32_t stag) {
    return table_.Check(stag, pd, AccessKind::kLocalRead, 0x1000, 1).status;
  };
  EXPECT_EQ(status(stag_ ^ 0x01), AccessStatus::kInvalidStag);  // key differs
  EXPECT_EQ(status(MakeStag(0, 0xA5)), AccessStatus::kInvalidStag);  // index 0
  EXPECT_EQ(status(0), AccessStatus::kInvalidStag);
  EXPECT_EQ(status(MakeStag(2, 0xA5)), AccessStatus::kInvalidStag);  // index past the table
  EXPECT_EQ(status(0xFFFFFFFFu), AccessStatus::kInvalidStag);
}

TEST_F(CheckTest, PdMismatchIsStagNotAssociated) {
  EXPECT_EQ(table_.Check(stag_, other_pd_, AccessKind::kLocalRead, 0x1000, 1).status,
            AccessStatus::kPdMismatch);
  EXPECT_EQ(table_.Check(stag_, kNoPd, AccessKind::kLocalRead, 0x1000, 1).status,
            AccessStatus::kPdMismatch);
}

TEST_F(CheckTest, FirstFailingCheckWins) {
  // PD before validity, rights, wrap and bounds.
  ASSERT_EQ(table_.InvalidateLocal(stag_, pd_), InvalidateStatus::kOk);
  EXPECT_EQ(table_.Check(stag_, other_pd_, AccessKind::kRemoteRead, kU64Max, 2).status,
            AccessStatus::kPdMismatch);
  // Validity before rights, wrap and bounds.
  EXPECT_EQ(Status(kU64Max, 2, AccessKind::kRemoteRead), AccessStatus::kInvalidated);
}

TEST(CheckOrder, RightsBeforeWrapBeforeBounds) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(16);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0x100, 16, Addr(buf), kLocalWrite).stag;
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kRemoteWrite, kU64Max, 2).status,
            AccessStatus::kAccessViolation);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kLocalWrite, kU64Max, 2).status,
            AccessStatus::kToWrap);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kLocalWrite, 0x0, 2).status,
            AccessStatus::kBaseOrBounds);
}

TEST(ZeroLength, PassesWithoutLookingAtTheStag) {
  // RFC 5042 6.3.5: a zero-length RDMA Read needs no valid STag; MPA v2 RTR
  // zero-length Writes/Reads carry an arbitrary STag (siw sends 1).
  MemoryTable table(Opts({0x01}));
  const PdId pd = table.AllocatePd();
  for (const std::uint32_t stag : {0u, 1u, 0xFFFFFFFFu}) {
    for (const AccessKind kind : {AccessKind::kRemoteRead, AccessKind::kRemoteWrite}) {
      const AccessCheckResult r = table.Check(stag, pd, kind, kU64Max, 0);
      EXPECT_EQ(r.status, AccessStatus::kOk);
      EXPECT_FALSE(r.region);
    }
  }
  // Also for a known STag in another PD, without rights, out of bounds.
  std::vector<std::uint8_t> buf(8);
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), AccessFlags::kNone).stag;
  EXPECT_EQ(table.Check(stag, pd + 1, AccessKind::kRemoteWrite, 100, 0).status, AccessStatus::kOk);
}

TEST(ZeroBased, ToIsAnOffsetFromZero) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(64);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag =
      table.Register(pd, 0x7000, 64, Addr(buf), kRw | AccessFlags::kZeroBased).stag;
  AccessCheckResult r = table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 64);
  ASSERT_EQ(r.status, AccessStatus::kOk);
  EXPECT_TRUE(r.region->zero_based());
  EXPECT_EQ(r.region->base_to(), 0u);
  EXPECT_EQ(r.region->HostPointer(0), buf.data());
  EXPECT_EQ(r.region->HostPointer(63), buf.data() + 63);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kRemoteWrite, 63, 2).status,
            AccessStatus::kBaseOrBounds);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kRemoteWrite, 0x7000, 1).status,
            AccessStatus::kBaseOrBounds);  // the IOVA means nothing here
}

TEST(Invalidate, LocalInvalidationFailsEveryLaterAccess) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag;
  EXPECT_EQ(table.InvalidateLocal(stag, pd + 1), InvalidateStatus::kPdMismatch);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kLocalWrite, 0, 8).status, AccessStatus::kOk);
  EXPECT_EQ(table.InvalidateLocal(stag, pd), InvalidateStatus::kOk);
  for (const AccessKind kind : {AccessKind::kLocalRead, AccessKind::kLocalWrite}) {
    EXPECT_EQ(table.Check(stag, pd, kind, 0, 1).status, AccessStatus::kInvalidated);
  }
  EXPECT_EQ(table.InvalidateLocal(stag, pd), InvalidateStatus::kOk);  // already invalid: fine
  EXPECT_EQ(table.InvalidateLocal(stag ^ 1, pd), InvalidateStatus::kInvalidStag);
  // Stays invalid until deregistered; deregistration still works.
  EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
  EXPECT_EQ(table.InvalidateLocal(stag, pd), InvalidateStatus::kInvalidStag);
}

// RFC 5040 8.1.1 rule 7: a peer cannot invalidate an STag shared on
// multiple streams, and a memory region is shared by every stream of its PD.
TEST(Invalidate, RemoteInvalidationOfAMemoryRegionIsRefused) {
  MemoryTable table(Opts({0x01, 0x02, 0x03}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t local = table.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag;
  const std::uint32_t readable = table.Register(pd, 0, 8, Addr(buf), kRemoteRead).stag;
  const std::uint32_t writable = table.Register(pd, 0, 8, Addr(buf), kRw).stag;
  EXPECT_EQ(table.InvalidateRemote(local, pd), InvalidateStatus::kCannotInvalidate);
  EXPECT_EQ(table.InvalidateRemote(readable, pd), InvalidateStatus::kCannotInvalidate);
  EXPECT_EQ(table.InvalidateRemote(writable, pd), InvalidateStatus::kCannotInvalidate);
  EXPECT_EQ(table.Check(local, pd, AccessKind::kLocalWrite, 0, 8).status, AccessStatus::kOk);
  EXPECT_EQ(table.Check(readable, pd, AccessKind::kRemoteRead, 0, 8).status, AccessStatus::kOk);
  EXPECT_EQ(table.Check(writable, pd, AccessKind::kRemoteWrite, 0, 8).status, AccessStatus::kOk);
  EXPECT_EQ(table.InvalidateRemote(readable, pd + 1), InvalidateStatus::kPdMismatch);
  EXPECT_EQ(table.InvalidateRemote(0, pd), InvalidateStatus::kInvalidStag);
  // The owner's Local Invalidate still works.
  EXPECT_EQ(table.InvalidateLocal(writable, pd), InvalidateStatus::kOk);
  EXPECT_EQ(table.Check(writable, pd, AccessKind::kRemoteWrite, 0, 8).status,
            AccessStatus::kInvalidated);
}

TEST(Deregister, UnknownAndRepeatedStags) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), kLocalWrite).stag;
  EXPECT_EQ(table.Deregister(0), DeregisterStatus::kInvalidStag);
  EXPECT_EQ(table.Deregister(stag ^ 0x80), DeregisterStatus::kInvalidStag);
  EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
  EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kInvalidStag);
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kLocalRead, 0, 1).status, AccessStatus::kInvalidStag);
  EXPECT_EQ(table.region_count(), 0u);
}

TEST(Deregister, WaitsForRegionRefsTakenBefore) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), kRw).stag;
  AccessCheckResult held = table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 8);
  ASSERT_EQ(held.status, AccessStatus::kOk);

  std::atomic<bool> returned{false};
  std::thread app([&] {
    EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
    returned.store(true);
  });
  // New checks fail as soon as the STag is unpublished...
  while (table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 8).status == AccessStatus::kOk) {
    std::this_thread::yield();
  }
  EXPECT_EQ(table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 8).status,
            AccessStatus::kInvalidStag);
  // ...but Deregister does not return while the earlier ref is held.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  EXPECT_FALSE(held.region->valid());  // a holder can see it is going away
  EXPECT_EQ(held.region->stag(), stag);  // the record itself stays readable
  held.region.Release();
  app.join();
  EXPECT_TRUE(returned.load());
}

TEST(RegionRef, MoveKeepsExactlyOnePin) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), kRw).stag;
  RegionRef a = table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 8).region;
  RegionRef b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(b);
  RegionRef c;
  c = std::move(b);
  EXPECT_TRUE(c);
  c = RegionRef();  // releases
  EXPECT_FALSE(c);
  // Nothing pins the region any more: Deregister returns at once.
  EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
}

// The progress thread checks and writes into regions while an application
// thread registers, deregisters and frees their buffers. Under ASan a write
// after Deregister returned would be a heap-use-after-free.
TEST(Concurrency, LookupsRaceWithDeregistration) {
  MemoryTable table;  // real getrandom keys
  const PdId pd = table.AllocatePd();
  constexpr int kSlots = 8;
  std::atomic<std::uint32_t> published[kSlots];
  for (auto& p : published) p.store(0);
  std::atomic<bool> stop{false};
  std::atomic<long> writes{0};

  std::thread progress([&] {
    std::uint32_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint32_t stag = published[n++ % kSlots].load(std::memory_order_acquire);
      AccessCheckResult r = table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 64);
      if (r.ok()) {
        ASSERT_EQ(r.region->stag(), stag);
        std::uint8_t* p = r.region->HostPointer(0);
        for (int i = 0; i < 64; ++i) p[i] = static_cast<std::uint8_t>(n + i);
        writes.fetch_add(1, std::memory_order_relaxed);
      } else {
        ASSERT_TRUE(r.status == AccessStatus::kInvalidStag) << AccessStatusName(r.status);
      }
    }
  });

  for (int round = 0; round < 2000; ++round) {
    const int slot = round % kSlots;
    auto buf = std::make_unique<std::uint8_t[]>(64);
    const RegisterResult r = table.Register(pd, 0, 64, reinterpret_cast<std::uintptr_t>(buf.get()),
                                            kRw | AccessFlags::kZeroBased);
    ASSERT_EQ(r.status, RegisterStatus::kOk);
    published[slot].store(r.stag, std::memory_order_release);
    std::this_thread::yield();
    published[slot].store(0, std::memory_order_release);
    ASSERT_EQ(table.Deregister(r.stag), DeregisterStatus::kOk);
    buf.reset();  // the application frees its buffer
  }
  stop.store(true);
  progress.join();
  EXPECT_EQ(table.region_count(), 0u);
  EXPECT_EQ(table.DeallocatePd(pd), PdStatus::kOk);
}

// A check writes only its own thread's reader record (memory.h), so the
// refs of every thread must each hold Deregister back: two threads hold a
// ref of the same region at once, each taken and released on its own
// thread.
TEST(Deregister, WaitsForRefsOfEveryThread) {
  MemoryTable table(Opts({0x01}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = table.Register(pd, 0, 8, Addr(buf), kRw).stag;
  std::atomic<int> holding{0};
  std::atomic<int> release{0};  // how many holders may let go
  auto holder = [&](int rank, AccessKind kind) {
    RegionRef ref = table.Check(stag, pd, kind, 0, 8).region;
    EXPECT_TRUE(ref);
    holding.fetch_add(1);
    while (release.load() < rank) std::this_thread::yield();
    ref.Release();
  };
  std::thread first(holder, 1, AccessKind::kRemoteWrite);
  std::thread second(holder, 2, AccessKind::kLocalWrite);
  while (holding.load() < 2) std::this_thread::yield();

  std::atomic<bool> returned{false};
  std::thread app([&] {
    EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
    returned.store(true);
  });
  while (table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 8).ok()) std::this_thread::yield();
  release.store(1);
  first.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());  // the second thread still holds it
  release.store(2);
  second.join();
  app.join();
  EXPECT_TRUE(returned.load());
}

// A thread that holds refs of more regions than its reader record has
// hazard words takes the rest under the writer lock (memory.cc): those hold
// Deregister back as well, and every region is released cleanly.
TEST(Deregister, WaitsForRefsBeyondTheHazardWords) {
  MemoryTable table(Opts({0x01}));
  const PdId pd = table.AllocatePd();
  constexpr int kRegions = 20;  // more than the 8 hazard words
  std::vector<std::vector<std::uint8_t>> bufs(kRegions, std::vector<std::uint8_t>(8));
  std::vector<std::uint32_t> stags;
  std::vector<RegionRef> refs;
  for (auto& b : bufs) {
    stags.push_back(table.Register(pd, 0, 8, Addr(b), kRw).stag);
    AccessCheckResult r = table.Check(stags.back(), pd, AccessKind::kRemoteWrite, 0, 8);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.region->host_address(), Addr(b));
    refs.push_back(std::move(r.region));
  }
  // A second ref of a region already held shares its word or its count.
  RegionRef again = table.Check(stags[kRegions - 1], pd, AccessKind::kRemoteWrite, 0, 8).region;
  ASSERT_TRUE(again);

  std::atomic<int> returned{0};
  std::thread app([&] {
    for (std::uint32_t stag : stags) {
      EXPECT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
      returned.fetch_add(1);
    }
  });
  for (int i = 0; i < kRegions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(i == kRegions - 1 ? 50 : 5));
    // Not timed: only a Deregister that did not wait could be ahead.
    EXPECT_LE(returned.load(), i) << "region " << i;
    if (i == kRegions - 1) {
      refs[i].Release();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_LE(returned.load(), i) << "the second ref of the last region";
      again.Release();
    } else {
      refs[i].Release();
    }
  }
  app.join();
  EXPECT_EQ(returned.load(), kRegions);
  EXPECT_EQ(table.region_count(), 0u);
}

// An STag that comes back (the same index and key drawn again after a
// deregistration) names the new region only: lookups racing with
// deregister + register of the same STag on other threads never reach the
// old record or the old buffer. Each buffer says which registration it
// belongs to (its length), so a lookup that reached an old region would
// see the wrong octet; under ASan it would be a heap-use-after-free (the
// table frees the record, the test the buffer, right after Deregister).
TEST(Concurrency, AReusedStagNeverReachesTheOldRegion) {
  MemoryTable::Options o;
  o.key_source = Keys({0x5A});
  o.index_source = Indices({0x1234});
  o.reuse_delay = 0;  // the same STag at every registration
  MemoryTable table(std::move(o));
  const PdId pd = table.AllocatePd();
  const std::uint32_t stag = MakeStag(0x1234, 0x5A);
  std::atomic<bool> stop{false};
  std::atomic<long> found{0};
  std::atomic<long> wrong{0};

  auto lookups = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      AccessCheckResult r = table.Check(stag, pd, AccessKind::kRemoteWrite, 0, 1);
      if (r.ok()) {
        // The registration's marker: its length, low octet.
        const std::uint8_t* p = r.region->HostPointer(0);
        if (p[0] != static_cast<std::uint8_t>(r.region->length())) wrong.fetch_add(1);
        found.fetch_add(1, std::memory_order_relaxed);
      } else if (r.status != AccessStatus::kInvalidStag) {
        wrong.fetch_add(1);
      }
    }
  };
  std::thread reader_a(lookups);
  std::thread reader_b(lookups);
  for (int round = 0; round < 3000; ++round) {
    const std::size_t length = 16 + static_cast<std::size_t>(round % 200);
    auto buf = std::make_unique<std::uint8_t[]>(length);
    buf[0] = static_cast<std::uint8_t>(length);
    const RegisterResult r = table.Register(pd, 0, length, reinterpret_cast<std::uintptr_t>(
                                                               buf.get()),
                                            kRw | AccessFlags::kZeroBased);
    ASSERT_EQ(r.status, RegisterStatus::kOk);
    ASSERT_EQ(r.stag, stag);
    if (round % 8 == 0) std::this_thread::yield();
    ASSERT_EQ(table.Deregister(stag), DeregisterStatus::kOk);
    buf[0] = 0xFF;  // nothing may read this registration's marker any more
    buf.reset();
  }
  stop.store(true);
  reader_a.join();
  reader_b.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(table.region_count(), 0u);
}

// checks() counts the lookups of every thread, per table.
TEST(Checks, CountsEveryThreadsLookupsPerTable) {
  MemoryTable a(Opts({0x01}));
  MemoryTable b(Opts({0x02}));
  std::vector<std::uint8_t> buf(8);
  const PdId pd_a = a.AllocatePd();
  const PdId pd_b = b.AllocatePd();
  const std::uint32_t stag_a = a.Register(pd_a, 0, 8, Addr(buf), kRw).stag;
  const std::uint32_t stag_b = b.Register(pd_b, 0, 8, Addr(buf), kRw).stag;
  auto work = [&] {
    for (int i = 0; i < 100; ++i) {
      EXPECT_TRUE(a.Check(stag_a, pd_a, AccessKind::kLocalRead, 0, 8).ok());
      EXPECT_TRUE(b.Check(stag_b, pd_b, AccessKind::kLocalRead, 0, 8).ok());
      EXPECT_TRUE(b.Check(stag_b + 1, pd_b, AccessKind::kLocalRead, 0, 8).status ==
                  AccessStatus::kInvalidStag);
    }
  };
  std::thread other(work);
  work();
  other.join();
  EXPECT_EQ(a.checks(), 200u);
  EXPECT_EQ(b.checks(), 400u);
}

TEST(AccessStatusName, NamesEveryStatus) {
  EXPECT_EQ(AccessStatusName(AccessStatus::kOk), "ok");
  EXPECT_EQ(AccessStatusName(AccessStatus::kInvalidStag), "invalid STag");
  EXPECT_EQ(AccessStatusName(AccessStatus::kToWrap), "tagged offset wrap");
  EXPECT_EQ(AccessStatusName(AccessStatus::kBaseOrBounds), "base or bounds violation");
}

TEST(AccessFlagsValues, MirrorIbvAccessFlags) {
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kLocalWrite), 1u);
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kRemoteWrite), 2u);
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kRemoteRead), 4u);
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kRemoteAtomic), 8u);
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kMwBind), 16u);
  EXPECT_EQ(static_cast<std::uint32_t>(AccessFlags::kZeroBased), 32u);
}

}  // namespace
}  // namespace siwx::engine
