// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// siwxdv.h: the connection manager hands a connected, MPA-negotiated TCP
// socket to a QP (siwx_qp_bind_stream_num), ends it
// (siwx_qp_disconnect_stream_num),
// counts what its CQs still hold for it (siwx_qp_unpolled_completions) and
// finds QPs by number (siwx_qp_lookup). Translation only: the engine QP
// does the binding (engine::Qp::Bind) and reports the stream's end through
// the context's engine callback (qp.cc, OnEngineEvent), which calls the
// notify the CM passed here, once per stream.
//
// Ownership of `fd`: the QP works on a duplicate of it, and the original is
// closed only once the bind succeeded; so on any failure the caller still
// owns an intact `fd` (whose file status flags now include O_NONBLOCK). The
// caller must have taken `fd` out of its own epoll sets: the duplicate keeps
// the socket open after the caller's close.
//
// The responder's wait for the RTR (RFC 6581 7.1) and its time limit
// (first_fpdu_timeout_ms) are the engine's: it sends nothing before the RTR
// and resets the stream when it does not come in time, which the notify
// reports as the stream's end. The same wait for the first FPDU without an
// RTR (wait_first_fpdu, RFC 5044 7.1.2 rule 4) only with
// SIWX_MPA_FIRST_FPDU=strict: held back, a responder that speaks first
// (ib_write_lat -R: the server writes first) deadlocks against an initiator
// waiting for it, and Linux siw does not hold back either.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/wire/mpa_constants.h"
#include "common/trace/stream_trace.h"
#include "common/util/log.h"
#include "providers/siwx/oob.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

static_assert(SIWX_RTR_MESSAGE_SEND == static_cast<int>(engine::RtrMessage::kSend));
static_assert(SIWX_RTR_MESSAGE_WRITE == static_cast<int>(engine::RtrMessage::kWrite));
static_assert(SIWX_RTR_MESSAGE_READ == static_cast<int>(engine::RtrMessage::kRead));

// The QP behind `ibqp` when it is a siwx QP, else null.
Qp* OurQp(ibv_qp* ibqp) {
  if (ibqp == nullptr || !IsSiwxContext(ibqp->context) || ibqp->qp_type != IBV_QPT_RC) {
    return nullptr;
  }
  return ToSiwx(ibqp);
}

// SIWX_MPA_FIRST_FPDU (README, Configuration), read once per process: true
// for `strict`, false for `relaxed` (the default).
bool StrictFirstFpdu() {
  static const bool strict = [] {
    const char* value = std::getenv("SIWX_MPA_FIRST_FPDU");
    if (value == nullptr || value[0] == '\0' || std::strcmp(value, "relaxed") == 0) return false;
    if (std::strcmp(value, "strict") == 0) return true;
    SIWX_LOG(kWarn, "SIWX_MPA_FIRST_FPDU='%s' is not strict or relaxed; using relaxed", value);
    return false;
  }();
  return strict;
}

// The caller's parameters with unknown trailing fields as 0: 0 or EINVAL.
int ReadParams(const siwx_stream_params* in, siwx_stream_params* out) {
  *out = siwx_stream_params{};
  if (in == nullptr || in->size < sizeof(in->size)) return EINVAL;
  std::memcpy(out, in, std::min<std::size_t>(in->size, sizeof(*out)));
  return 0;
}

// siwx_stream_params -> engine::StreamParams: 0 or EINVAL.
int ToEngine(const siwx_stream_params& in, engine::StreamParams* out) {
  // Grid offsets are positions modulo the marker interval (RFC 5044 4.3).
  if (in.tx_marker_grid_offset >= mpa::kMarkerInterval ||
      in.rx_marker_grid_offset >= mpa::kMarkerInterval) {
    return EINVAL;
  }
  if (in.ird > DeviceLimits::kMaxIrd || in.ord > DeviceLimits::kMaxOrd) return EINVAL;
  out->crc_enabled = in.crc != 0;
  out->tx_markers = in.tx_markers != 0;
  out->tx_marker_grid_offset = in.tx_marker_grid_offset;
  out->rx_markers = in.rx_markers != 0;
  out->rx_marker_grid_offset = in.rx_marker_grid_offset;
  out->ird = in.ird;
  out->ord = in.ord;
  out->large_fpdus = in.large_fpdus != 0;
  out->max_ulpdu = in.max_ulpdu;
  out->mpa_dialect = in.mpa_dialect <= SIWX_MPA_DIALECT_V2 ? in.mpa_dialect : 0;
  out->mpa_revision = in.mpa_revision;
  switch (in.rtr_role) {
    case SIWX_RTR_ROLE_NONE:
      out->rtr_role = engine::RtrRole::kNone;
      break;
    case SIWX_RTR_ROLE_SEND:
      if (in.rtr_message > SIWX_RTR_MESSAGE_READ) return EINVAL;
      out->rtr_role = engine::RtrRole::kSend;
      out->rtr_message = static_cast<engine::RtrMessage>(in.rtr_message);
      break;
    case SIWX_RTR_ROLE_AWAIT: {
      constexpr unsigned kAll = SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ;
      const unsigned mask = in.rtr_accept_mask;
      if (mask == 0 || (mask & ~kAll) != 0) return EINVAL;
      out->rtr_role = engine::RtrRole::kAwait;
      // Any advertised type may arrive: the Initiator chose (RFC 6581 9.2).
      // SIWX_RTR_MASK_* bits are 1 << RtrMessage (static_asserts above).
      out->rtr_accept_mask = static_cast<std::uint8_t>(mask);
      out->rtr_message = (mask & SIWX_RTR_MASK_WRITE) != 0  ? engine::RtrMessage::kWrite
                         : (mask & SIWX_RTR_MASK_READ) != 0 ? engine::RtrMessage::kRead
                                                            : engine::RtrMessage::kSend;
      break;
    }
    default:
      return EINVAL;
  }
  out->await_first_fpdu = in.wait_first_fpdu != 0 && StrictFirstFpdu();
  out->first_fpdu_timeout = std::chrono::milliseconds(in.first_fpdu_timeout_ms);
  return 0;
}

bool IsStreamSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

// The engine QP numbered `qp_num` on `context`, kept alive by the reference
// even if the application destroys the QP meanwhile; null if there is none.
// Under qp_mutex: DestroyQp takes the QP out of the map before it frees it.
std::shared_ptr<engine::Qp> EngineQp(Context* context, std::uint32_t qp_num) {
  ContextState* state = context->state;
  if (state == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(qp_num);
  return it == state->qps.end() ? nullptr : it->second->shared->engine;
}

// Sets (or, with `notify` null, clears) the QP's stream notify, if the QP
// numbered `qp_num` is still the one behind `engine_qp`. False if it is gone.
bool SetNotify(Context* context, std::uint32_t qp_num, const engine::Qp* engine_qp,
               const siwx_stream_notify* notify) {
  ContextState* state = context->state;
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(qp_num);
  if (it == state->qps.end() || it->second->shared->engine.get() != engine_qp) return false;
  QpShared& shared = *it->second->shared;
  std::lock_guard<std::mutex> shared_lock(shared.mutex);
  shared.notify_pending = notify != nullptr && notify->event != nullptr;
  shared.notify = notify != nullptr ? *notify : siwx_stream_notify{};
  return true;
}

}  // namespace

// By number throughout, never through a Qp pointer: the application may
// destroy the QP with ibv_destroy_qp on another thread at any moment.
int BindStream(Context* context, std::uint32_t qp_num, int fd, const siwx_stream_params* raw,
         const siwx_stream_notify* notify) {
  siwx_stream_params in;
  if (int error = ReadParams(raw, &in); error != 0) return error;
  engine::StreamParams params;
  if (int error = ToEngine(in, &params); error != 0) return error;
  if (fd < 0 || !IsStreamSocket(fd)) return EINVAL;
  if (Inherited(context)) return EPERM;
  const std::shared_ptr<engine::Qp> engine_qp = EngineQp(context, qp_num);
  if (engine_qp == nullptr) return ENOENT;
  const engine::QpState state = engine_qp->state();
  if (state == engine::QpState::kError) return EINVAL;
  if (state != engine::QpState::kInit && state != engine::QpState::kRtr) {
    return engine_qp->Query().bound ? EBUSY : EINVAL;
  }
  const int own_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own_fd < 0) return errno == EMFILE || errno == ENFILE ? errno : ENOMEM;
  std::unique_ptr<transport::TcpStream> stream(new (std::nothrow) transport::TcpStream(own_fd));
  if (stream == nullptr) {
    ::close(own_fd);
    return ENOMEM;
  }
  if (!SetNotify(context, qp_num, engine_qp.get(), notify)) return ENOENT;
  engine::BindStatus status;
  try {
    status = engine_qp->Bind(std::move(stream), params);
  } catch (...) {
    status = engine::BindStatus::kInvalidState;
  }
  if (status != engine::BindStatus::kOk) {
    if (!SetNotify(context, qp_num, engine_qp.get(), nullptr)) return ENOENT;
    // A concurrent bind won the race: EBUSY, as if it had come first.
    const bool other_stream =
        engine_qp->state() != engine::QpState::kError && engine_qp->Query().bound;
    if (status == engine::BindStatus::kInvalidState && other_stream) return EBUSY;
    return EINVAL;
  }
  ::close(fd);  // the QP's duplicate keeps the connection
  return 0;
}

namespace {

int Disconnect(Context* context, std::uint32_t qp_num, int abortive) {
  if (Inherited(context)) return EPERM;
  const std::shared_ptr<engine::Qp> engine_qp = EngineQp(context, qp_num);
  if (engine_qp == nullptr) return ENOENT;
  if (!engine_qp->Query().bound) return EINVAL;
  try {
    if (abortive != 0) {
      // ERR resets the connection (RST) and flushes (qp_state.h).
      engine_qp->Modify(engine::QpState::kError);
    } else {
      // SQD: FIN after what is queued. A stream that is already ending
      // (SQD, SQE, ERR) needs nothing more.
      engine_qp->Disconnect();
    }
  } catch (...) {
    return ENOMEM;
  }
  return 0;
}

}  // namespace
}  // namespace siwx::provider

using siwx::provider::Qp;

namespace {

// A bind by the connection manager: the QP is the CM's from now on, and a
// stream the out-of-band listener parked for it is dropped (oob.h).
int CmBind(siwx::provider::Context* context, uint32_t qp_num, int fd,
           const siwx_stream_params* params, const siwx_stream_notify* notify) {
  const int rc = siwx::provider::BindStream(context, qp_num, fd, params, notify);
  if (rc == 0) siwx::provider::oob::NoteCmBound(context, qp_num);
  return rc;
}

}  // namespace

extern "C" {

void siwx_trace_stream_io(int fd, int direction, const void* data, size_t length) {
  siwx::trace::Tracer* tracer = siwx::trace::Tracer::Global();
  if (tracer == nullptr || data == nullptr || length == 0) return;
  const std::shared_ptr<siwx::trace::Connection> connection = tracer->ConnectionOf(fd);
  if (connection == nullptr) return;
  tracer->Record(*connection,
                 direction == 0 ? siwx::trace::Direction::kSent : siwx::trace::Direction::kReceived,
                 siwx::ByteSpan(static_cast<const std::uint8_t*>(data), length));
}

int siwx_qp_bind_stream(ibv_qp* ibqp, int fd, const siwx_stream_params* params,
                        const siwx_stream_notify* notify) {
  Qp* qp = siwx::provider::OurQp(ibqp);
  if (qp == nullptr) return EINVAL;
  return CmBind(qp->context, ibqp->qp_num, fd, params, notify);
}

int siwx_qp_bind_stream_num(ibv_context* context, uint32_t qp_num, int fd,
                            const siwx_stream_params* params, const siwx_stream_notify* notify) {
  if (!siwx::provider::IsSiwxContext(context)) return EINVAL;
  return CmBind(siwx::provider::ToSiwx(context), qp_num, fd, params, notify);
}

int siwx_qp_disconnect_stream(ibv_qp* ibqp, int abortive) {
  Qp* qp = siwx::provider::OurQp(ibqp);
  if (qp == nullptr) return EINVAL;
  const int rc = siwx::provider::Disconnect(qp->context, ibqp->qp_num, abortive);
  return rc == ENOENT ? EINVAL : rc;
}

int siwx_qp_disconnect_stream_num(ibv_context* context, uint32_t qp_num, int abortive) {
  if (!siwx::provider::IsSiwxContext(context)) return EINVAL;
  return siwx::provider::Disconnect(siwx::provider::ToSiwx(context), qp_num, abortive);
}

int siwx_qp_unpolled_completions(ibv_context* context, uint32_t qp_num, uint32_t* count) {
  if (count == nullptr || !siwx::provider::IsSiwxContext(context)) return EINVAL;
  *count = 0;
  siwx::provider::ContextState* state = siwx::provider::ToSiwx(context)->state;
  if (state == nullptr) return ENOENT;
  // Under qp_mutex: DestroyQp takes the QP out of the map before it frees
  // it, so the QP and its CQs stay valid while we count (the caller may be
  // racing an ibv_destroy_qp it does not know about).
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(qp_num);
  if (it == state->qps.end()) return ENOENT;
  const Qp& qp = *it->second;
  std::size_t n = qp.send_cq->queue->CountSuccessful(qp_num);
  if (qp.recv_cq != qp.send_cq) n += qp.recv_cq->queue->CountSuccessful(qp_num);
  *count = static_cast<uint32_t>(std::min<std::size_t>(n, UINT32_MAX));
  return 0;
}

ibv_qp* siwx_qp_lookup(ibv_context* context, uint32_t qp_num) {
  if (!siwx::provider::IsSiwxContext(context)) {
    errno = EINVAL;
    return nullptr;
  }
  Qp* qp = siwx::provider::FindQp(siwx::provider::ToSiwx(context), qp_num);
  if (qp == nullptr) {
    errno = ENOENT;
    return nullptr;
  }
  return &qp->vqp.qp;
}

}  // extern "C"
