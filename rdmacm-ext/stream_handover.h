// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The CM's side of providers/siwx/siwxdv.h: finds the provider's handover
// functions at run time and turns negotiated MPA parameters into the plain C
// struct siwx_stream_params.
//
// The functions are looked up with dlsym(RTLD_DEFAULT) and, failing that, in
// an already loaded libsiwx-rdmav<PABI>.so (RTLD_NOLOAD: libibverbs may have
// loaded it without RTLD_GLOBAL). Nothing is loaded here. Missing functions
// mean CM-only mode: the CM keeps the socket and still reports ESTABLISHED.
#pragma once

#include "common/mpa/mpa_negotiator.h"
#include "providers/siwx/siwxdv.h"

namespace siwx::cm {

// By QP number throughout: the application may destroy a QP with
// ibv_destroy_qp on any thread, so the CM never keeps an ibv_qp pointer it
// did not create.
struct ProviderHandover {
  siwx_qp_bind_stream_num_fn bind = nullptr;
  siwx_qp_disconnect_stream_num_fn disconnect = nullptr;
  siwx_qp_lookup_fn lookup = nullptr;
  siwx_qp_unpolled_completions_fn unpolled = nullptr;  // null: disconnects are never held
  siwx_trace_stream_io_fn trace_io = nullptr;          // SIWX_TRACE of the startup frames
};

// Looked up once per process.
const ProviderHandover& GetProviderHandover();

// The stream parameters for `params` as negotiated by an end in `role`.
siwx_stream_params MakeStreamParams(const mpa::NegotiatedParams& params, mpa::MpaRole role,
                                    std::uint32_t first_fpdu_timeout_ms);

std::uint32_t RtrMask(const mpa::RtrTypeSet& types);
int DialectNumber(mpa::MpaDialect d);  // enum siwx_mpa_dialect

}  // namespace siwx::cm
