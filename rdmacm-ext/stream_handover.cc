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

}  // namespace siwx::cm
