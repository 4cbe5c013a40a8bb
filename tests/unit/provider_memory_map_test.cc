// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Registration's view of the process's mappings (providers/siwx/memory_map.h):
// a range must be mapped and readable, and writable when the registration
// lets anyone write it, as the kernel's page pinning requires (EFAULT).
#include "providers/siwx/memory_map.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace siwx::provider {
namespace {

// Three mappings as /proc/self/maps lists them: rw, then r-- right after,
// a hole, then ---.
constexpr std::string_view kMaps =
    "7f0000001000-7f0000003000 rw-p 00000000 00:00 0 \n"
    "7f0000003000-7f0000004000 r--p 00002000 fd:01 1234     /usr/lib/libx.so\n"
    "7f0000008000-7f0000009000 ---p 00000000 00:00 0 \n";

TEST(ProviderMemoryMapTest, ClassifiesRangesAgainstTheMappings) {
  struct Case {
    std::uintptr_t begin, end;
    bool write;
    RangeAccess want;
  };
  const Case cases[] = {
      {0x7f0000001000, 0x7f0000003000, true, RangeAccess::kOk},           // the rw mapping
      {0x7f0000001800, 0x7f0000001801, true, RangeAccess::kOk},           // one octet inside
      {0x7f0000002000, 0x7f0000003800, false, RangeAccess::kOk},          // rw then r--, read
      {0x7f0000002000, 0x7f0000003800, true, RangeAccess::kNotWritable},  // ... and write
      {0x7f0000003000, 0x7f0000004000, true, RangeAccess::kNotWritable},
      {0x7f0000003000, 0x7f0000004000, false, RangeAccess::kOk},
      {0x7f0000003800, 0x7f0000004800, false, RangeAccess::kUnmapped},    // runs into the hole
      {0x7f0000005000, 0x7f0000006000, false, RangeAccess::kUnmapped},    // inside the hole
      {0x7f0000000000, 0x7f0000001800, true, RangeAccess::kUnmapped},     // starts before
      {0x7f0000008000, 0x7f0000008010, false, RangeAccess::kNotReadable},  // PROT_NONE
      {0x7f0000009000, 0x7f000000a000, false, RangeAccess::kUnmapped},    // after the last
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << std::hex << c.begin << "-" << c.end << " w=" << c.write);
    EXPECT_EQ(ClassifyRange(kMaps, c.begin, c.end, c.write), c.want);
  }
  // Unparsable lines are skipped, not trusted.
  EXPECT_EQ(ClassifyRange("garbage\n7f0000001000-7f0000003000 rw-p 0 0 0\n", 0x7f0000001000,
                          0x7f0000002000, true),
            RangeAccess::kOk);
  EXPECT_EQ(ClassifyRange("", 0x1000, 0x2000, false), RangeAccess::kUnmapped);
}

TEST(ProviderMemoryMapTest, SeesThisProcessesProtections) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  const auto base = reinterpret_cast<std::uintptr_t>(mem);
  ASSERT_EQ(mprotect(static_cast<char*>(mem) + page, page, PROT_READ), 0);
  ASSERT_EQ(munmap(static_cast<char*>(mem) + 2 * page, page), 0);
  EXPECT_EQ(QueryRangeAccess(base, page, true), RangeAccess::kOk);
  EXPECT_EQ(QueryRangeAccess(base, 2 * page, false), RangeAccess::kOk);
  EXPECT_EQ(QueryRangeAccess(base, 2 * page, true), RangeAccess::kNotWritable);
  EXPECT_EQ(QueryRangeAccess(base + page, page, false), RangeAccess::kOk);
  EXPECT_EQ(QueryRangeAccess(base + page, 2 * page, false), RangeAccess::kUnmapped);
  ASSERT_EQ(mprotect(mem, page, PROT_NONE), 0);
  EXPECT_EQ(QueryRangeAccess(base, 1, false), RangeAccess::kNotReadable);
  ASSERT_EQ(munmap(mem, 2 * page), 0);
}

}  // namespace
}  // namespace siwx::provider
