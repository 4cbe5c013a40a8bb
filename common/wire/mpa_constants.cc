#include "common/wire/mpa_constants.h"

namespace siwx::mpa {

std::string_view MpaErrorName(MpaError e) {
  switch (e) {
    case MpaError::kNone: return "no error";
    case MpaError::kConnectionLost: return "TCP connection closed, reset or lost";
    case MpaError::kCrcMismatch: return "MPA CRC mismatch";
    case MpaError::kMarkerMismatch: return "MPA marker disagrees with ULPDU_Length";
    case MpaError::kInvalidStartupFrame: return "invalid MPA Request or Reply frame";
  }
  return "unknown MPA error";
}

}  // namespace siwx::mpa
