// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Diagnostics of every part of siwx (engine, provider, kernel shim, CM):
// one line per message on stderr, prefixed "siwx: <level>: ". Each shared
// object links its own copy (common/ is a static library); they all read
// the same setting.
//
// Quiet by default: only errors that siwx itself cannot recover from are
// printed. SIWX_LOG_LEVEL=error|warn|info|debug raises the verbosity; it is
// read once, in log.cc, and nowhere else. An unknown value is reported once
// and treated as "error". Errors an application caused (bad arguments) are
// returned through errno, never logged above debug.
//
// Levels: error = siwx cannot go on; warn = a setting or resource problem
// the user should fix; info = what happened to a connection (negotiated
// parameters, every Terminate sent or received with its decoded cause, a
// stream reset); debug = everything else.
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

// SIWX_LOG with a "QP <n>: " prefix: every message about a QP starts the same
// way, so one QP's story can be grepped out of a log.
#define SIWX_QP_LOG(level, qp_num, format, ...) \
  SIWX_LOG(level, "QP %u: " format, static_cast<unsigned>(qp_num) __VA_OPT__(, ) __VA_ARGS__)
