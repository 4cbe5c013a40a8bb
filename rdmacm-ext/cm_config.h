// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Configuration of the userspace connection manager: which MPA startup
// dialect to offer and accept (RFC 5044 7.1, the Rtr/S-bit proposal,
// RFC 6581), the CRC and marker policies, peer-to-peer RTR, and the bounds
// on connection setup time.
//
// The environment is read in exactly one place, GetCmConfig(), once per
// process. Variables (all optional; see also rdmacm-ext/README.md):
//
//   SIWX_MPA_DIALECT     v2 | v1-rtr | v1            default v2
//       Active side: the dialect of the MPA Request. Passive side: the
//       highest dialect accepted; every lower one is accepted too.
//   SIWX_MPA_CRC         allow | require | refuse    default allow
//       allow: C = 0 in our frames, CRC on when the peer sets C (what Linux
//       siw does); require: C = 1; refuse: reject/fail a peer that sets C.
//   SIWX_MPA_MARKERS     allow | require | refuse    default allow
//       require: M = 1 (the peer must insert markers toward us); refuse:
//       reject/fail a peer whose M bit asks us to insert markers.
//   SIWX_MPA_P2P         off | on | <list of send,write,read>   default off
//       Active side: on or a list asks for the RFC 6581 peer-to-peer model
//       (A = 1) offering those RTR types (on: all three). Passive side: the
//       RTR types accepted from a peer-to-peer Initiator (off and on: all
//       three). Needs v2.
//   SIWX_MPA_LARGE_FPDUS 0 | 1                        default 0
//       0 (standard): never set the bit; FPDUs follow the EMSS (RFC 5044
//       4.5 MULPDU). 1 (non-standard, opt-in): offer (active side) and
//       accept (passive side) FPDUs larger than the EMSS allows, signalled
//       with the Linux siw driver's experimental bit 0x0800 of the startup
//       frame, a Res bit that RFC 5044 7.1.1 says must be sent as zero.
//       Used only when both frames carry it. Received FPDUs of any length
//       RFC 5044 allows are taken either way.
//   SIWX_CM_CONNECT_TIMEOUT_MS   1..600000           default 10000
//       Bound on the TCP connect (then UNREACHABLE, status -ETIMEDOUT).
//   SIWX_MPA_TIMEOUT_MS          1..600000           default 10000
//       Bound on every wait for an MPA startup frame and, after the
//       handover, for the first FPDU (RFC 5044 7.1.2 rules 8 and 10).
//   SIWX_CM_HALF_OPEN_MAX        1..65536            default 256
//       Connections accepted by all listeners of the process whose MPA
//       Request has not arrived yet. At the bound, the oldest of them is
//       dropped to make room for a new one.
//   SIWX_CM_HALF_OPEN_PER_SOURCE 1..65536            default 32
//       The same, counted per peer IP address (at most the total above).
//
// A value that does not parse is reported once (warn level) and the default
// is used. Per-id overrides: siwx_cm_set_mpa_options() in siwx_cm.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/mpa/mpa_negotiator.h"

namespace siwx::cm {

// CRC and marker handling; kAllow is "off unless the peer asks".
enum class Policy : std::uint8_t { kAllow, kRequire, kRefuse };

struct MpaOptions {
  mpa::MpaDialect dialect = mpa::MpaDialect::kV2;
  Policy crc = Policy::kAllow;
  Policy markers = Policy::kAllow;
  bool peer_to_peer = false;  // active side: ask for A = 1 (needs v2)
  // Active: offered with peer_to_peer. Passive: accepted (RFC 6581 9.2
  // requires at least one, so an empty set is refused by the parser).
  mpa::RtrTypeSet rtr_types{true, true, true};
  // Offer (active) / accept (passive) FPDUs above MULPDU: siw's L bit, an
  // RFC 5044 Res bit, so off unless asked for.
  bool large_fpdus = false;
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds mpa_timeout{10000};

  friend bool operator==(const MpaOptions&, const MpaOptions&) = default;
};

struct CmConfig {
  MpaOptions mpa;
  // Bounds on half-open connections (accepted, MPA Request not complete):
  // in total and per peer address. Scans and slow peers cannot hold more.
  std::size_t half_open_max = 256;
  std::size_t half_open_per_source = 32;
  // One line per variable that was set but not understood.
  std::vector<std::string> problems;
};

// Parses the variables above through `lookup` (name -> value or nullptr).
CmConfig ParseCmConfig(const std::function<const char*(const char*)>& lookup);

// The process configuration: ParseCmConfig(getenv), read once; problems are
// logged at warn level the first time.
const CmConfig& GetCmConfig();

// Bounds of the millisecond settings.
inline constexpr std::int64_t kMinTimeoutMs = 1;
inline constexpr std::int64_t kMaxTimeoutMs = 600000;
// Bound of the half-open settings.
inline constexpr std::int64_t kMaxHalfOpen = 65536;

// The negotiator configuration for one connection. `ird`/`ord` are the
// Initiator's offer (RFC 6581 9.1); the Responder gives its own to Accept().
mpa::NegotiatorConfig MakeNegotiatorConfig(const MpaOptions& options, mpa::MpaRole role,
                                           std::uint16_t ird, std::uint16_t ord);

std::string_view PolicyName(Policy p);
// "v2", "v1-rtr", "v1".
std::string_view DialectToken(mpa::MpaDialect d);

}  // namespace siwx::cm
