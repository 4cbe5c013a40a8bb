// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, the siwx_cm.h additions: per-id MPA options, connection info
// and the peer's whole private data.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {

// ---- siwx_cm.h ----

int Core::GetMpaOptions(rdma_cm_id* pub, siwx_cm_mpa_options* out) {
  if (out == nullptr || out->size < sizeof(siwx_cm_mpa_options)) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  const MpaOptions& o = id->options;
  out->size = sizeof(siwx_cm_mpa_options);
  out->dialect = static_cast<std::uint32_t>(DialectNumber(o.dialect));
  out->crc = static_cast<std::uint32_t>(o.crc);
  out->markers = static_cast<std::uint32_t>(o.markers);
  out->peer_to_peer = o.peer_to_peer ? 1 : 0;
  out->rtr_mask = RtrMask(o.rtr_types);
  out->connect_timeout_ms = static_cast<std::uint32_t>(o.connect_timeout.count());
  out->mpa_timeout_ms = static_cast<std::uint32_t>(o.mpa_timeout.count());
  out->large_fpdus = o.large_fpdus ? 1 : 0;
  return 0;
}

int Core::SetMpaOptions(rdma_cm_id* pub, const siwx_cm_mpa_options& in) {
  if (in.size < sizeof(siwx_cm_mpa_options)) return EINVAL;
  MpaOptions o;
  switch (in.dialect) {
    case SIWX_MPA_DIALECT_V1: o.dialect = mpa::MpaDialect::kV1; break;
    case SIWX_MPA_DIALECT_V1_RTR: o.dialect = mpa::MpaDialect::kV1Rtr; break;
    case SIWX_MPA_DIALECT_V2: o.dialect = mpa::MpaDialect::kV2; break;
    default: return EINVAL;
  }
  if (in.crc > SIWX_CM_POLICY_REFUSE || in.markers > SIWX_CM_POLICY_REFUSE) return EINVAL;
  o.crc = static_cast<Policy>(in.crc);
  o.markers = static_cast<Policy>(in.markers);
  constexpr std::uint32_t kAllRtr = SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ;
  if (in.rtr_mask == 0 || (in.rtr_mask & ~kAllRtr) != 0) return EINVAL;
  o.rtr_types = {(in.rtr_mask & SIWX_RTR_MASK_SEND) != 0, (in.rtr_mask & SIWX_RTR_MASK_WRITE) != 0,
                 (in.rtr_mask & SIWX_RTR_MASK_READ) != 0};
  if (in.peer_to_peer > 1) return EINVAL;
  o.peer_to_peer = in.peer_to_peer == 1;
  if (o.peer_to_peer && o.dialect != mpa::MpaDialect::kV2) return EINVAL;
  auto in_range = [](std::uint32_t ms) { return ms >= kMinTimeoutMs && ms <= kMaxTimeoutMs; };
  if (!in_range(in.connect_timeout_ms) || !in_range(in.mpa_timeout_ms)) return EINVAL;
  o.connect_timeout = std::chrono::milliseconds(in.connect_timeout_ms);
  o.mpa_timeout = std::chrono::milliseconds(in.mpa_timeout_ms);
  if (in.large_fpdus > 1) return EINVAL;
  o.large_fpdus = in.large_fpdus == 1;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  id->options = o;
  return 0;
}

int Core::ConnectionInfo(rdma_cm_id* pub, siwx_cm_conn_info* out) {
  if (out == nullptr || out->size < sizeof(siwx_cm_conn_info)) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  if (!id->started) return ENOTCONN;
  siwx_cm_conn_info info{};
  info.size = sizeof(info);
  info.role =
      id->role == mpa::MpaRole::kInitiator ? SIWX_CM_ROLE_INITIATOR : SIWX_CM_ROLE_RESPONDER;
  const mpa::NegotiatedParams& p = id->mpa.negotiated;
  if (id->mpa.done) {
    info.dialect = static_cast<std::uint32_t>(DialectNumber(p.dialect));
    info.mpa_revision = p.revision;
    info.crc = p.crc ? 1 : 0;
    info.tx_markers = p.markers_tx ? 1 : 0;
    info.rx_markers = p.markers_rx ? 1 : 0;
    info.ird = p.ird;
    info.ord = p.ord;
    info.ird_ord_exchanged = p.ird_ord_exchanged ? 1 : 0;
    info.peer_to_peer = p.peer_to_peer ? 1 : 0;
    info.large_fpdus = p.large_fpdus ? 1 : 0;
    const siwx_stream_params sp =
        MakeStreamParams(p, id->role, static_cast<std::uint32_t>(id->options.mpa_timeout.count()));
    info.rtr_role = sp.rtr_role;
    info.rtr_message = sp.rtr_message;
    info.rtr_mask = RtrMask(p.rtr_types);
  }
  // The peer's word and private data are known from a Request or from any
  // Reply, accepting or rejecting (RFC 6581 9.1).
  const mpa::NegotiatedParams& seen =
      (!id->mpa.done && id->mpa.negotiator != nullptr) ? id->mpa.negotiator->params() : p;
  if (seen.peer_ird_ord) {
    info.peer_ird_ord_valid = 1;
    info.peer_ird = seen.peer_ird_ord->ird;
    info.peer_ord = seen.peer_ird_ord->ord;
  }
  info.peer_private_data_len = static_cast<std::uint32_t>(seen.peer_private_data.size());
  info.stream_bound = id->stream.bound ? 1 : 0;
  info.mpa_error = static_cast<std::uint32_t>(id->mpa.error);
  info.status = id->last_status;
  info.failure_code = static_cast<std::uint32_t>(id->failure_code);
  std::snprintf(info.failure, sizeof(info.failure), "%s", id->failure.c_str());
  *out = info;
  return 0;
}

int Core::PeerPrivateData(rdma_cm_id* pub, void* buf, std::size_t len, std::size_t* full) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || (buf == nullptr && len != 0)) return EINVAL;
  if (!id->started) return ENOTCONN;
  const mpa::NegotiatedParams& seen =
      (!id->mpa.done && id->mpa.negotiator != nullptr) ? id->mpa.negotiator->params()
                                                       : id->mpa.negotiated;
  const std::vector<std::uint8_t>& pd = seen.peer_private_data;
  if (!pd.empty() && len != 0) std::memcpy(buf, pd.data(), std::min(len, pd.size()));
  *full = pd.size();
  return 0;
}

}  // namespace siwx::cm
