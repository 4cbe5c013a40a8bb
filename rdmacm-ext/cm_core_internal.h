// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Helpers shared by the files that implement cm::Core (cm_core.cc,
// cm_address.cc, cm_connect.cc, cm_mpa.cc, cm_stream.cc, cm_qp.cc,
// cm_options.cc). Not part of the library's interface.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "common/mpa/mpa_negotiator.h"
#include "rdmacm-ext/cm_core.h"

namespace siwx::cm {

inline mpa::MpaTime NowMpa(TimePoint t) {
  return std::chrono::duration_cast<mpa::MpaTime>(t.time_since_epoch());
}

inline TimePoint FromMpa(mpa::MpaTime t) {
  return TimePoint(std::chrono::duration_cast<Clock::duration>(t));
}

inline std::uint8_t ClampU8(std::uint32_t v) {
  return static_cast<std::uint8_t>(std::min<std::uint32_t>(v, 255));
}

inline bool ExpectsFrames(const mpa::MpaNegotiator& n) {
  const mpa::NegotiatorState s = n.state();
  return s == mpa::NegotiatorState::kAwaitingReply || s == mpa::NegotiatorState::kAwaitingRequest ||
         s == mpa::NegotiatorState::kAwaitingRtr;
}

}  // namespace siwx::cm
