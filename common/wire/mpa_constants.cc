// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/mpa_constants.h"

namespace siwx::mpa {

std::string_view MpaErrorName(MpaError e) {
  switch (e) {
    case MpaError::kNone: return "no error";
    case MpaError::kConnectionLost: return "TCP connection closed, reset or lost";
    case MpaError::kCrcMismatch: return "MPA CRC mismatch";
    case MpaError::kMarkerMismatch: return "MPA marker disagrees with ULPDU_Length";
    case MpaError::kInvalidStartupFrame: return "invalid MPA Request or Reply frame";
    case MpaError::kLocalCatastrophic: return "local catastrophic error";
    case MpaError::kInsufficientIrd: return "insufficient IRD resources";
    case MpaError::kNoMatchingRtr: return "no matching RTR option";
  }
  return "unknown MPA error";
}

}  // namespace siwx::mpa
