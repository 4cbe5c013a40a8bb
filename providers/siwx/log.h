// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Diagnostics of the provider and the kernel shim: one line per message on
// stderr, prefixed "siwx: <level>: ".
//
// Quiet by default: only errors that siwx itself cannot recover from are
// printed. SIWX_LOG_LEVEL=error|warn|info|debug raises the verbosity; it is
// read once, in log.cc, and nowhere else. An unknown value is reported once
// and treated as "error". Errors an application caused (bad arguments) are
// returned through errno, never logged above debug.
//
// Every message says what was wrong and what to do about it.
#pragma once

namespace siwx::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// True if messages at `level` are printed.
bool Enabled(Level level);

// printf-style; appends the newline.
void Write(Level level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace siwx::log

#define SIWX_LOG(level, ...)                                         \
  do {                                                               \
    if (::siwx::log::Enabled(::siwx::log::Level::level)) {           \
      ::siwx::log::Write(::siwx::log::Level::level, __VA_ARGS__);    \
    }                                                                \
  } while (0)
