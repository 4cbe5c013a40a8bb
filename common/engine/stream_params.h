// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What the connection manager hands to a QP together with a connected
// socket: the outcome of MPA negotiation (RFC 5044 7.1, RFC 6581) that the
// data path needs.
//
// Directions are named from this end: "tx" is what we send, "rx" what we
// receive. CRC is negotiated for the connection as a whole (RFC 5044 7.1.1
// "C"); markers per direction (each side's M bit asks for markers in what it
// receives). Marker grid offsets are stream positions modulo 512 of the first
// octet after the startup frames, 0 at the start of Full Operation.
//
// IRD/ORD are the negotiated values: `ird` is how many inbound RDMA Read
// Requests this end serves at once (a Read Request beyond it ends the stream
// with a Terminate), `ord` how many outbound Read Requests it may have
// outstanding (a Read WR waits while the ORQ is full).
//
// RTR (RFC 6581 section 7.1, peer-to-peer mode): one side sends a zero-length
// Send, RDMA Write or RDMA Read as its first message; the other side does not
// transmit until that message arrives, absorbs it (it completes nothing and
// consumes no receive WR) and answers a Read RTR with a zero-length Read
// Response.
//
// First FPDU (RFC 5044 7.1.2 rule 4): "MPA Responder mode implementations
// MUST receive and validate at least one FPDU before sending any FPDUs or
// Markers." A responder holds back everything until then; with an RTR that
// first FPDU is the RTR (RFC 6581 3). Rule 10 asks for a timeout on the
// wait: when `first_fpdu_timeout` passes without it, the stream is reset
// (no Terminate: that would be an FPDU, which rule 4 forbids) and the QP
// fails.
//
// Not validated here: whether the values are what the two MPA frames said;
// the CM owns that. Qp::Bind checks the ranges.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/wire/fpdu.h"

namespace siwx::engine {

enum class RtrRole : std::uint8_t {
  kNone = 0,  // no RTR: both sides may transmit at once
  kSend,      // we send the zero-length RTR message first
  kAwait,     // we wait for the peer's RTR message before transmitting
};

// Which zero-length message carries the RTR (RFC 6581 7.1, the IRD/ORD word's
// RTR flags).
enum class RtrMessage : std::uint8_t {
  kSend = 0,   // zero-length Send (QN 0, MSN 1)
  kWrite = 1,  // zero-length RDMA Write
  kRead = 2,   // zero-length RDMA Read Request (QN 1, MSN 1), answered by a
               // zero-length Read Response
};

// Largest IRD/ORD value the RFC 6581 IRD/ORD word can carry (14 bits).
inline constexpr std::uint32_t kMaxReadDepth = 0x3FFF;  // RFC 6581 7.1

// The EMSS a "large FPDU" stream pretends to have: FPDUs as long as a
// 16-bit ULPDU_Length and, with markers, 16-bit FPDUPTRs allow.
inline constexpr std::size_t kLargeFpduEmss = mpa::kMaxUlpduLength;  // RFC 5044 4.1, 4.5

// Smallest max ULPDU the engine accepts: a Terminate with all header copies
// (18 + 52 octets) must fit in one FPDU, and a Send must carry payload.
inline constexpr std::size_t kMinMaxUlpdu = 128;

struct StreamParams {
  bool crc_enabled = false;              // RFC 5044 7.1.1 "C"
  bool tx_markers = false;               // markers in what we send, RFC 5044 4.3
  std::uint32_t tx_marker_grid_offset = 0;
  bool rx_markers = false;               // markers in what we receive
  std::uint32_t rx_marker_grid_offset = 0;

  std::uint32_t ird = 1;  // inbound Read Requests served at once, RFC 6581 7.1
  std::uint32_t ord = 1;  // outbound Read Requests outstanding, RFC 6581 7.1

  // Both ends agreed to FPDUs larger than the EMSS allows (a siwx-to-siwx
  // option; RFC 5044 4.5 MULPDU otherwise).
  bool large_fpdus = false;
  // Largest ULPDU (DDP header + payload) we send; 0 derives it from the EMSS
  // (RFC 5044 4.5) or, with large_fpdus or on a non-TCP stream, from
  // kLargeFpduEmss. A non-zero value is clamped to what the framing allows.
  std::size_t max_ulpdu = 0;

  RtrRole rtr_role = RtrRole::kNone;
  // kSend: the RTR message to send. kAwait: the one expected when
  // rtr_accept_mask is 0.
  RtrMessage rtr_message = RtrMessage::kSend;

  // Responder: send nothing before one FPDU has arrived and been validated
  // (RFC 5044 7.1.2 rule 4). Implied by RtrRole::kAwait.
  bool await_first_fpdu = false;
  // How long that wait (or the wait for the RTR) may take; 0: no limit.
  std::chrono::milliseconds first_fpdu_timeout{0};
  // kAwait: every RTR message the Reply advertised, bit 1 << RtrMessage;
  // the Initiator picks one of them (RFC 6581 9.2), so any may arrive.
  std::uint8_t rtr_accept_mask = 0;

  // Informational, for logs and `siwx stat`: the MPA startup dialect the CM
  // negotiated (enum siwx_mpa_dialect numbering: 1 v1, 2 v1 + Rtr, 3 v2; 0
  // unknown) and the Rev of the Reply. The data path never reads them.
  std::uint8_t mpa_dialect = 0;
  std::uint8_t mpa_revision = 0;
};

// "MPA v2 (RFC 6581)" etc. for StreamParams::mpa_dialect.
inline const char* MpaDialectLabel(std::uint8_t dialect) {
  switch (dialect) {
    case 1: return "MPA v1 (RFC 5044)";
    case 2: return "MPA v1 + Rtr (not an RFC)";
    case 3: return "MPA v2 (RFC 6581)";
    default: return "MPA dialect unknown";
  }
}

// The max ULPDU a stream with these parameters sends, given the TCP EMSS (0
// when the stream is not TCP). Never above what kLargeFpduEmss allows, so
// FPDUPTRs always fit 16 bits.
inline std::size_t EffectiveMaxUlpdu(const StreamParams& params, std::size_t emss) {
  const std::size_t ceiling = mpa::Mulpdu(kLargeFpduEmss, params.tx_markers);
  if (params.max_ulpdu != 0) return std::min(params.max_ulpdu, ceiling);
  if (params.large_fpdus || emss == 0) return ceiling;
  return std::min(mpa::Mulpdu(emss, params.tx_markers), ceiling);
}

}  // namespace siwx::engine
