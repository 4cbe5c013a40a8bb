// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Asynchronous events: records on the context's async_fd, which stock
// ibv_get_async_event() reads, and the acknowledgement wait that destroying
// an object needs.
//
// Record: struct ib_uverbs_async_event_desc in host order, {u64 element;
// u32 event_type; u32 reserved}. element is the ibv_cq / ibv_srq / ibv_qp
// pointer, or the port number for port and device events; libibverbs casts it
// back by event type.
#include <cstring>

#include "common/util/log.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

struct AsyncRecord {
  std::uint64_t element;
  std::uint32_t event_type;
  std::uint32_t reserved;
};
static_assert(sizeof(AsyncRecord) == kAsyncRecordSize);

AsyncRecord Decode(ByteSpan bytes) {
  AsyncRecord record{};
  std::memcpy(&record, bytes.data(), sizeof(record));
  return record;
}

}  // namespace

void PostAsyncEvent(Context* context, std::uint64_t element, ibv_event_type type) {
  ContextState* state = context->state;
  if (state == nullptr || state->async_events == nullptr) return;
  const AsyncRecord record{element, static_cast<std::uint32_t>(type), 0};
  std::uint8_t bytes[sizeof(record)];
  std::memcpy(bytes, &record, sizeof(record));
  bool posted = false;
  try {
    posted = state->async_events->Post(ByteSpan(bytes, sizeof(bytes)));
  } catch (...) {
    posted = false;
  }
  if (!posted) {
    SIWX_LOG(kError, "%s: async event %s not delivered: out of memory or the async fd "
             "was closed by the application (it must stay open while the device is)",
             context->vctx.context.device->name, ibv_event_type_str(type));
  }
}

std::size_t PurgeAsyncEvents(Context* context, std::uint64_t element,
                             std::initializer_list<ibv_event_type> types) {
  ContextState* state = context->state;
  if (state == nullptr || state->async_events == nullptr) return 0;
  try {
    return state->async_events->Purge([&](ByteSpan bytes) {
      const AsyncRecord record = Decode(bytes);
      if (record.element != element) return false;
      for (ibv_event_type type : types) {
        if (record.event_type == static_cast<std::uint32_t>(type)) return true;
      }
      return false;
    });
  } catch (...) {
    return 0;
  }
}

void WaitForAcks(pthread_mutex_t* mutex, pthread_cond_t* cond, const std::uint32_t* completed,
                 std::uint32_t reported) {
  pthread_mutex_lock(mutex);
  // ibv_ack_*_events add to *completed under `mutex` and signal `cond`.
  while (*completed < reported) pthread_cond_wait(cond, mutex);
  pthread_mutex_unlock(mutex);
}

void AsyncEvent(ibv_context* ibctx, ibv_async_event* /*event*/) noexcept {
  // libibverbs calls this after each record it read: room for the backlog.
  ContextState* state = ToSiwx(ibctx)->state;
  if (state == nullptr || state->async_events == nullptr) return;
  try {
    state->async_events->OnConsumed();
  } catch (...) {
  }
}

}  // namespace siwx::provider
