// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What an MPA negotiation (common/mpa) hands to a QP, in the provider's
// stream-bind ABI (siwxdv.h): one conversion for both paths that bind
// streams, the connection manager (rdmacm-ext/) and the out-of-band connect
// (oob.cc). Header-only: the CM reaches the provider through dlsym and
// links none of it.
#pragma once

#include <cstdint>

#include "common/mpa/mpa_negotiator.h"
#include "providers/siwx/siwxdv.h"

namespace siwx::provider {

static_assert(SIWX_RTR_MESSAGE_SEND == 0 && SIWX_RTR_MESSAGE_WRITE == 1 &&
                  SIWX_RTR_MESSAGE_READ == 2,
              "values mirror siwx::engine::RtrMessage");

// The SIWX_RTR_MASK_* bits of `types`.
inline std::uint32_t RtrMask(const mpa::RtrTypeSet& types) {
  return (types.send ? SIWX_RTR_MASK_SEND : 0u) | (types.write ? SIWX_RTR_MASK_WRITE : 0u) |
         (types.read ? SIWX_RTR_MASK_READ : 0u);
}

// enum siwx_mpa_dialect
inline int DialectNumber(mpa::MpaDialect d) {
  switch (d) {
    case mpa::MpaDialect::kV1: return SIWX_MPA_DIALECT_V1;
    case mpa::MpaDialect::kV1Rtr: return SIWX_MPA_DIALECT_V1_RTR;
    case mpa::MpaDialect::kV2: return SIWX_MPA_DIALECT_V2;
  }
  return 0;
}

// The stream parameters for `params` as negotiated by an end in `role`.
inline siwx_stream_params MakeStreamParams(const mpa::NegotiatedParams& params,
                                           mpa::MpaRole role,
                                           std::uint32_t first_fpdu_timeout_ms) {
  siwx_stream_params p{};
  p.size = sizeof(p);
  p.mpa_dialect = static_cast<std::uint8_t>(DialectNumber(params.dialect));
  p.mpa_revision = params.revision;
  p.crc = params.crc ? 1 : 0;
  p.tx_markers = params.markers_tx ? 1 : 0;
  p.rx_markers = params.markers_rx ? 1 : 0;
  // Both startup frames carried L: the QP sends FPDUs above MULPDU.
  p.large_fpdus = params.large_fpdus ? 1 : 0;
  p.ird = params.ird;
  p.ord = params.ord;
  p.rtr_role = SIWX_RTR_ROLE_NONE;
  if (role == mpa::MpaRole::kInitiator && params.rtr != mpa::RtrType::kNone) {
    p.rtr_role = SIWX_RTR_ROLE_SEND;
    switch (params.rtr) {
      case mpa::RtrType::kSend: p.rtr_message = SIWX_RTR_MESSAGE_SEND; break;
      case mpa::RtrType::kWrite: p.rtr_message = SIWX_RTR_MESSAGE_WRITE; break;
      case mpa::RtrType::kRead: p.rtr_message = SIWX_RTR_MESSAGE_READ; break;
      case mpa::RtrType::kNone: break;
    }
  } else if (role == mpa::MpaRole::kResponder && params.peer_to_peer) {
    p.rtr_role = SIWX_RTR_ROLE_AWAIT;
    p.rtr_accept_mask = static_cast<std::uint8_t>(RtrMask(params.rtr_types));
  }
  // RFC 5044 7.1.2 rule 4; with an RTR the first FPDU is the RTR (RFC 6581 3).
  p.wait_first_fpdu = params.first_send == mpa::FirstSendRule::kAfterFirstFpdu ? 1 : 0;
  if (p.wait_first_fpdu || p.rtr_role == SIWX_RTR_ROLE_AWAIT) {
    p.first_fpdu_timeout_ms = first_fpdu_timeout_ms;
  }
  return p;
}

}  // namespace siwx::provider
