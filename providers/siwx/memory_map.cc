// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "providers/siwx/memory_map.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace siwx::provider {
namespace {

// Parses a hex number at the front of `text`, advancing it; false if none.
bool TakeHex(std::string_view& text, std::uintptr_t& value) {
  std::size_t i = 0;
  value = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<unsigned>(c - 'a' + 10);
    } else {
      break;
    }
    value = value << 4 | digit;
  }
  text.remove_prefix(i);
  return i > 0;
}

struct Mapping {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  bool readable = false;
  bool writable = false;
};

// One "start-end perms ..." line; false if it does not parse.
bool ParseLine(std::string_view line, Mapping& m) {
  if (!TakeHex(line, m.start) || line.empty() || line.front() != '-') return false;
  line.remove_prefix(1);
  if (!TakeHex(line, m.end) || line.size() < 3 || line.front() != ' ') return false;
  m.readable = line[1] == 'r';
  m.writable = line[2] == 'w';
  return m.start < m.end;
}

}  // namespace

RangeAccess ClassifyRange(std::string_view maps, std::uintptr_t begin, std::uintptr_t end,
                          bool need_write) {
  std::uintptr_t covered = begin;  // [begin, covered) is mapped and allowed
  while (!maps.empty() && covered < end) {
    const std::size_t eol = maps.find('\n');
    const std::string_view line = maps.substr(0, eol);
    maps.remove_prefix(eol == std::string_view::npos ? maps.size() : eol + 1);
    Mapping m;
    if (!ParseLine(line, m) || m.end <= covered) continue;
    if (m.start > covered) return RangeAccess::kUnmapped;  // a hole before this mapping
    if (!m.readable) return RangeAccess::kNotReadable;
    if (need_write && !m.writable) return RangeAccess::kNotWritable;
    covered = m.end;
  }
  return covered >= end ? RangeAccess::kOk : RangeAccess::kUnmapped;
}

std::optional<RangeAccess> QueryRangeAccess(std::uintptr_t begin, std::size_t length,
                                            bool need_write) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string maps;
  bool ok = true;
  try {
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        ok = false;
        break;
      }
      if (n == 0) break;
      maps.append(chunk, static_cast<std::size_t>(n));
    }
  } catch (...) {
    ok = false;  // no memory for the copy
  }
  ::close(fd);
  if (!ok) return std::nullopt;
  return ClassifyRange(maps, begin, begin + length, need_write);
}

}  // namespace siwx::provider
