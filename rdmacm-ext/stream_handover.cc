// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "rdmacm-ext/stream_handover.h"

#include <dlfcn.h>

#include <string>

#include "common/util/log.h"

#ifndef SIWX_PROVIDER_LIBRARY
#define SIWX_PROVIDER_LIBRARY "libsiwx-rdmav34.so"
#endif

namespace siwx::cm {
namespace {

void* FindSymbol(const char* name) {
  if (void* s = dlsym(RTLD_DEFAULT, name)) return s;
  void* provider = dlopen(SIWX_PROVIDER_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
  if (provider == nullptr) return nullptr;
  void* s = dlsym(provider, name);
  dlclose(provider);  // drops only the reference RTLD_NOLOAD took
  return s;
}

static_assert(SIWX_RTR_MESSAGE_SEND == 0 && SIWX_RTR_MESSAGE_WRITE == 1 &&
                  SIWX_RTR_MESSAGE_READ == 2,
              "values mirror siwx::engine::RtrMessage");

}  // namespace

const ProviderHandover& GetProviderHandover() {
  static const ProviderHandover handover = [] {
    ProviderHandover h;
    h.bind = reinterpret_cast<siwx_qp_bind_stream_num_fn>(FindSymbol("siwx_qp_bind_stream_num"));
    h.disconnect = reinterpret_cast<siwx_qp_disconnect_stream_num_fn>(
        FindSymbol("siwx_qp_disconnect_stream_num"));
    h.lookup = reinterpret_cast<siwx_qp_lookup_fn>(FindSymbol("siwx_qp_lookup"));
    h.unpolled = reinterpret_cast<siwx_qp_unpolled_completions_fn>(
        FindSymbol("siwx_qp_unpolled_completions"));
    h.trace_io = reinterpret_cast<siwx_trace_stream_io_fn>(FindSymbol("siwx_trace_stream_io"));
    if (h.bind == nullptr) {
      SIWX_LOG(kInfo, "CM: the provider exports no siwx_qp_bind_stream_num; connections stay in "
                      "the CM (CM-only mode, no data path)");
    }
    return h;
  }();
  return handover;
}

std::uint32_t RtrMask(const mpa::RtrTypeSet& types) {
  return (types.send ? SIWX_RTR_MASK_SEND : 0u) | (types.write ? SIWX_RTR_MASK_WRITE : 0u) |
         (types.read ? SIWX_RTR_MASK_READ : 0u);
}

int DialectNumber(mpa::MpaDialect d) {
  switch (d) {
    case mpa::MpaDialect::kV1: return SIWX_MPA_DIALECT_V1;
    case mpa::MpaDialect::kV1Rtr: return SIWX_MPA_DIALECT_V1_RTR;
    case mpa::MpaDialect::kV2: return SIWX_MPA_DIALECT_V2;
  }
  return 0;
}

siwx_stream_params MakeStreamParams(const mpa::NegotiatedParams& params, mpa::MpaRole role,
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

}  // namespace siwx::cm
