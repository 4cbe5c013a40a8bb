// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/util/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace siwx::log {
namespace {

constexpr const char* kLevelNames[] = {"error", "warn", "info", "debug"};

struct Setting {
  Level level = Level::kError;
  bool unknown = false;  // SIWX_LOG_LEVEL was set to something we do not know
};

// The only place SIWX_LOG_LEVEL is read.
Setting ReadSetting() {
  Setting setting;
  const char* value = std::getenv("SIWX_LOG_LEVEL");
  if (value == nullptr || value[0] == '\0') return setting;
  for (int i = 0; i < 4; ++i) {
    if (strcasecmp(value, kLevelNames[i]) == 0) {
      setting.level = static_cast<Level>(i);
      return setting;
    }
  }
  setting.unknown = true;
  return setting;
}

const Setting& CurrentSetting() {
  static const Setting setting = [] {
    Setting s = ReadSetting();
    if (s.unknown) {
      std::fprintf(stderr,
                   "siwx: warn: SIWX_LOG_LEVEL='%s' is not a log level; "
                   "use error, warn, info or debug (using error)\n",
                   std::getenv("SIWX_LOG_LEVEL"));
    }
    return s;
  }();
  return setting;
}

}  // namespace

bool Enabled(Level level) {
  return static_cast<int>(level) <= static_cast<int>(CurrentSetting().level);
}

void Write(Level level, const char* format, ...) {
  // One fprintf per line so concurrent messages do not interleave mid-line.
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  std::fprintf(stderr, "siwx: %s: %s\n", kLevelNames[static_cast<int>(level)], line);
}

}  // namespace siwx::log
