// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Whether a range of the process's memory can be registered with the access
// it asks for, judged from the kernel's list of mappings (/proc/self/maps).
//
// Memory is not pinned (memory.cc): the engine reads and writes the
// application's virtual addresses itself, so a registration must refuse
// what it could not honour. Kernel providers pin the pages with
// get_user_pages, which fails with EFAULT for an unmapped page, for a page
// without read permission, and, when the registration lets anyone write
// (local write, remote write, remote atomic, window binding), for a page
// without write permission. A peer's RDMA Write into a read-only page would
// otherwise fault in the engine. mincore(2) only tells whether pages are
// mapped, and probing by writing would change the memory, so the mappings'
// permissions are read from /proc/self/maps, once per registration (a slow
// path: one read of a few kilobytes).
//
// What this cannot see: the application changing the protection or the
// mapping after registering it (mprotect, munmap). That breaks the
// registration; see rx.h for what the engine then does.
//
// Threading: no state; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace siwx::provider {

enum class RangeAccess : std::uint8_t {
  kOk = 0,
  kUnmapped,     // a page of the range is not mapped
  kNotReadable,  // a page lacks read permission
  kNotWritable,  // write was asked for and a page lacks write permission
};

// Classifies [begin, end) (begin < end) against `maps`, text in the format
// of /proc/<pid>/maps (one mapping a line, in ascending address order:
// "start-end perms offset dev inode [path]", addresses in hex). The first
// problem found from `begin` on is reported.
RangeAccess ClassifyRange(std::string_view maps, std::uintptr_t begin, std::uintptr_t end,
                          bool need_write);

// The same for the calling process's current mappings; std::nullopt when
// /proc/self/maps cannot be read (no /proc), so the caller can fall back.
std::optional<RangeAccess> QueryRangeAccess(std::uintptr_t begin, std::size_t length,
                                            bool need_write);

}  // namespace siwx::provider
