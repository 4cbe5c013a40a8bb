// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Constants of MPA (RFC 5044) and its startup extensions (RFC 6581 and the
// Rtr/S-bit peer-to-peer proposal) that more than one codec needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace siwx::mpa {

inline constexpr std::size_t kUlpduLengthSize = 2;   // RFC 5044 4.1
inline constexpr std::size_t kCrcSize = 4;           // RFC 5044 4.1
inline constexpr std::size_t kMarkerSize = 4;        // RFC 5044 4.3
inline constexpr std::size_t kMarkerInterval = 512;  // RFC 5044 4.3
inline constexpr std::size_t kPadAlign = 4;          // RFC 5044 4.1

inline constexpr std::size_t kKeySize = 16;              // RFC 5044 7.1.1
inline constexpr std::size_t kStartupHeaderSize = 20;    // key + flags/rev + PD_Length
inline constexpr std::size_t kMaxPrivateDataLength = 512;  // RFC 5044 7.1.1

inline constexpr std::string_view kRequestKey = "MPA ID Req Frame";  // RFC 5044 7.1.1
inline constexpr std::string_view kReplyKey = "MPA ID Rep Frame";    // RFC 5044 7.1.1
// Rtr/S-bit proposal: the frame the requester sends after an accepting Reply.
inline constexpr std::string_view kRtrKey = "MPA ID RtR Frame";

// Error codes MPA reports to its consumer (RFC 5044 section 8, extended by
// RFC 6581 section 8). They are also the error codes of Terminate messages
// with layer LLP, error type MPA (RFC 5040 7.2, RFC 6581 8).
enum class MpaError : std::uint8_t {
  kNone = 0,
  kConnectionLost = 1,      // closed, reset, FIN or timeout
  kCrcMismatch = 2,         // received CRC differs from the computed one
  kMarkerMismatch = 3,      // marker and ULPDU_Length disagree on FPDU start
  kInvalidStartupFrame = 4, // invalid MPA Request or Reply frame
  kLocalCatastrophic = 5,   // RFC 6581 8, 9.3: local error with no specific code
  kInsufficientIrd = 6,     // RFC 6581 8, 9.1: Initiator cannot meet the Responder ORD
  kNoMatchingRtr = 7,       // RFC 6581 8, 9.2: no mutually usable connection model / RTR
};

std::string_view MpaErrorName(MpaError e);

}  // namespace siwx::mpa
