// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Completion queues and completion channels.
//
// A CQ is an engine::CompletionQueue. Its notification callback (armed by
// ibv_req_notify_cq, fired by the engine on the pushing thread) writes the
// ibv_cq pointer into the CQ's completion channel, where stock
// ibv_get_cq_event() reads it and calls our cq_event op; that op is where the
// channel's backlog moves on (event_queue.h). A CQ overflow becomes
// IBV_EVENT_CQ_ERR on the context's async fd.
//
// Completion channels are created by the kernel shim's
// ibv_create_comp_channel() through siwx_create_comp_channel(): libibverbs'
// own one needs the kernel. The fd is the read end of the channel's
// EventQueue.
//
// Destroy order (destroy_cq): refuse while QPs use the CQ; delete the engine
// queue so no callback can post any more; take back the events nobody has
// read yet; then wait until the application acknowledged every event it did
// read, as the kernel path in libibverbs does (ibv_cmd_destroy_cq).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>

#include "common/util/log.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

// SIWX_POLL_WAIT_US (docs/settings.txt), read once per process: how long an
// empty ibv_poll_cq may sleep when only another thread can complete
// anything on the CQ (engine::CompletionQueue::set_poll_wait).
constexpr long kDefaultPollWaitUs = 50;
constexpr long kMaxPollWaitUs = 1000;

std::chrono::microseconds PollWait() {
  static const std::chrono::microseconds wait(NumericSetting(
      "SIWX_POLL_WAIT_US", 0, kMaxPollWaitUs, kDefaultPollWaitUs, "microseconds"));
  return wait;
}

static_assert(static_cast<int>(engine::WcStatus::kSuccess) == IBV_WC_SUCCESS);
static_assert(static_cast<int>(engine::WcStatus::kLocLenErr) == IBV_WC_LOC_LEN_ERR);
static_assert(static_cast<int>(engine::WcStatus::kLocProtErr) == IBV_WC_LOC_PROT_ERR);
static_assert(static_cast<int>(engine::WcStatus::kWrFlushErr) == IBV_WC_WR_FLUSH_ERR);
static_assert(static_cast<int>(engine::WcStatus::kRemAccessErr) == IBV_WC_REM_ACCESS_ERR);
static_assert(static_cast<int>(engine::WcStatus::kRemOpErr) == IBV_WC_REM_OP_ERR);
static_assert(static_cast<int>(engine::WcStatus::kFatalErr) == IBV_WC_FATAL_ERR);
static_assert(static_cast<int>(engine::WcStatus::kGeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(engine::WcOpcode::kSend) == IBV_WC_SEND);
static_assert(static_cast<int>(engine::WcOpcode::kRdmaWrite) == IBV_WC_RDMA_WRITE);
static_assert(static_cast<int>(engine::WcOpcode::kRdmaRead) == IBV_WC_RDMA_READ);
static_assert(static_cast<int>(engine::WcOpcode::kCompSwap) == IBV_WC_COMP_SWAP);
static_assert(static_cast<int>(engine::WcOpcode::kFetchAdd) == IBV_WC_FETCH_ADD);
static_assert(static_cast<int>(engine::WcOpcode::kBindMw) == IBV_WC_BIND_MW);
static_assert(static_cast<int>(engine::WcOpcode::kLocalInv) == IBV_WC_LOCAL_INV);
static_assert(static_cast<int>(engine::WcOpcode::kRecv) == IBV_WC_RECV);
static_assert(static_cast<int>(engine::WcOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<unsigned>(engine::kWcWithImm) == static_cast<unsigned>(IBV_WC_WITH_IMM));
static_assert(static_cast<unsigned>(engine::kWcWithInv) == static_cast<unsigned>(IBV_WC_WITH_INV));

bool IsOurChannel(const ibv_comp_channel* channel, const ibv_context* context) {
  return channel->context == context &&
         reinterpret_cast<const CompChannel*>(channel)->magic == kCompChannelMagic;
}

void PostCompletionEvent(Cq* cq) {
  CompChannel* channel = cq->channel;
  if (channel == nullptr) return;  // armed without a channel: nowhere to report
  const std::uint64_t handle = reinterpret_cast<std::uintptr_t>(&cq->vcq.cq);
  std::uint8_t record[kCompRecordSize];
  std::memcpy(record, &handle, sizeof(handle));
  cq->comp_events_posted.fetch_add(1);
  bool posted = false;
  try {
    posted = channel->events->Post(ByteSpan(record, sizeof(record)));
  } catch (...) {
    posted = false;
  }
  if (!posted) {
    cq->comp_events_posted.fetch_sub(1);
    SIWX_LOG(kError, "completion event not delivered: out of memory or the channel fd "
                     "was closed by the application (use ibv_destroy_comp_channel)");
  }
}

void ToVerbs(const engine::WorkCompletion& in, ibv_wc* out) {
  *out = ibv_wc{};
  out->wr_id = in.wr_id;
  out->status = static_cast<ibv_wc_status>(in.status);
  out->opcode = static_cast<ibv_wc_opcode>(in.opcode);
  out->vendor_err = in.vendor_err;
  out->byte_len = in.byte_len;
  out->qp_num = in.qp_num;
  out->src_qp = in.src_qp;
  out->wc_flags = in.wc_flags;
  // imm_data and invalidated_rkey share a union; imm_data is in network order.
  if ((in.wc_flags & engine::kWcWithInv) != 0) {
    out->invalidated_rkey = in.invalidated_rkey;
  } else if ((in.wc_flags & engine::kWcWithImm) != 0) {
    out->imm_data = htobe32(in.imm_data);
  }
}

}  // namespace

ibv_comp_channel* CreateCompChannel(ibv_context* context) noexcept {
  auto* channel = new (std::nothrow) CompChannel();
  if (channel == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  std::unique_ptr<EventQueue> events;
  try {
    events = EventQueue::Create(kCompRecordSize);
  } catch (...) {
    errno = ENOMEM;
  }
  if (events == nullptr) {
    const int error = errno;
    delete channel;
    SIWX_LOG(kWarn, "cannot create a completion channel: %s%s", std::strerror(error),
             error == EMFILE || error == ENFILE ? "; raise the open-files limit (ulimit -n)" : "");
    errno = error;
    return nullptr;
  }
  channel->base.context = context;
  channel->base.fd = events->read_fd();
  channel->base.refcnt = 0;  // libibverbs counts the CQs (verbs_init_cq)
  channel->magic = kCompChannelMagic;
  channel->events = events.release();
  return &channel->base;
}

int DestroyCompChannel(ibv_comp_channel* ibchannel) noexcept {
  if (!IsOurChannel(ibchannel, ibchannel->context)) return EINVAL;
  CompChannel* channel = ToSiwx(ibchannel);
  // Same rule and lock as libibverbs' own ibv_destroy_comp_channel.
  pthread_mutex_lock(&ibchannel->context->mutex);
  if (ibchannel->refcnt != 0) {
    pthread_mutex_unlock(&ibchannel->context->mutex);
    return EBUSY;
  }
  channel->magic = 0;
  pthread_mutex_unlock(&ibchannel->context->mutex);
  delete channel->events;  // closes both ends
  delete channel;
  return 0;
}

ibv_cq* CreateCq(ibv_context* ibctx, int cqe, ibv_comp_channel* ibchannel,
                 int comp_vector) noexcept {
  Context* context = ToSiwx(ibctx);
  if (cqe < 1 || static_cast<std::uint32_t>(cqe) > DeviceLimits::kMaxCqe) {
    errno = EINVAL;
    return nullptr;
  }
  if (comp_vector < 0 || comp_vector >= ibctx->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  if (ibchannel != nullptr && !IsOurChannel(ibchannel, ibctx)) {
    errno = EINVAL;  // a channel of another context (or not a channel)
    return nullptr;
  }
  Device* device = context->state->device;
  if (!TakeBudget(device->cq_count, DeviceLimits::kMaxCq)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* cq = new (std::nothrow) Cq();
  if (cq == nullptr) {
    ReturnBudget(device->cq_count);
    errno = ENOMEM;
    return nullptr;
  }
  cq->context = context;
  cq->channel = ibchannel != nullptr ? ToSiwx(ibchannel) : nullptr;
  std::unique_ptr<engine::CompletionQueue> queue;
  try {
    engine::CompletionQueue::Callbacks callbacks;
    callbacks.on_completion = [cq] { PostCompletionEvent(cq); };
    callbacks.on_async_event = [cq](engine::CqEvent) {
      cq->async_events_posted.fetch_add(1);
      PostAsyncEvent(cq->context, reinterpret_cast<std::uintptr_t>(&cq->vcq.cq),
                     IBV_EVENT_CQ_ERR);
    };
    queue = engine::CompletionQueue::Create(static_cast<std::uint32_t>(cqe), std::move(callbacks));
    if (queue != nullptr) queue->set_poll_wait(PollWait());
  } catch (...) {
    queue.reset();
  }
  if (queue == nullptr) {
    delete cq;
    ReturnBudget(device->cq_count);
    errno = ENOMEM;
    return nullptr;
  }
  cq->queue = queue.release();
  cq->vcq.cq.cqe = cqe;
  // libibverbs fills context, channel, cq_context and the event counters
  // (verbs_init_cq) and takes the channel reference.
  return &cq->vcq.cq;
}

int DestroyCq(ibv_cq* ibcq) noexcept {
  Cq* cq = ToSiwx(ibcq);
  if (Inherited(cq->context)) return 0;  // forgotten (provider.h, fork())
  if (cq->users.load() != 0) return EBUSY;  // ibv_destroy_cq(3): QPs still use it
  delete cq->queue;
  cq->queue = nullptr;

  std::uint32_t comp_reported = cq->comp_events_posted.load();
  if (cq->channel != nullptr) {
    const auto handle = reinterpret_cast<std::uintptr_t>(ibcq);
    std::size_t purged = 0;
    try {
      purged = cq->channel->events->Purge([handle](ByteSpan record) {
        std::uint64_t value;
        std::memcpy(&value, record.data(), sizeof(value));
        return value == handle;
      });
    } catch (...) {
      purged = 0;
    }
    comp_reported -= static_cast<std::uint32_t>(purged);
  }
  const std::size_t async_purged =
      PurgeAsyncEvents(cq->context, reinterpret_cast<std::uintptr_t>(ibcq), {IBV_EVENT_CQ_ERR});
  const std::uint32_t async_reported =
      cq->async_events_posted.load() - static_cast<std::uint32_t>(async_purged);
  WaitForAcks(&ibcq->mutex, &ibcq->cond, &ibcq->comp_events_completed, comp_reported);
  WaitForAcks(&ibcq->mutex, &ibcq->cond, &ibcq->async_events_completed, async_reported);

  ReturnBudget(cq->context->state->device->cq_count);
  delete cq;  // libibverbs drops the channel reference after we return
  return 0;
}

int PollCq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) noexcept {
  if (num_entries < 0 || (num_entries > 0 && wc == nullptr)) return -EINVAL;
  Cq* cq = ToSiwx(ibcq);
  if (Inherited(cq->context)) return -EPERM;
  engine::WorkCompletion batch[16];
  int done = 0;
  while (done < num_entries) {
    const std::size_t want = std::min<std::size_t>(std::size(batch),
                                                   static_cast<std::size_t>(num_entries - done));
    // An empty CQ gives its QPs' receive sides a turn on this thread first:
    // an application spinning here (ib_send_lat) completes its own receives
    // instead of waiting for the progress thread's wake-up.
    const std::span<engine::WorkCompletion> out(batch, want);
    const std::size_t got = done == 0 ? cq->queue->PollWithProgress(out) : cq->queue->Poll(out);
    for (std::size_t i = 0; i < got; ++i) ToVerbs(batch[i], &wc[done + static_cast<int>(i)]);
    done += static_cast<int>(got);
    if (got < want) break;
  }
  return done;
}

int ReqNotifyCq(ibv_cq* ibcq, int solicited_only) noexcept {
  ToSiwx(ibcq)->queue->Arm(solicited_only != 0 ? engine::CqArm::kSolicited
                                               : engine::CqArm::kNextCompletion);
  return 0;
}

void CqEvent(ibv_cq* ibcq) noexcept {
  // ibv_get_cq_event read one record of this CQ's channel: room for backlog.
  Cq* cq = ToSiwx(ibcq);
  if (cq->channel == nullptr) return;
  try {
    cq->channel->events->OnConsumed();
  } catch (...) {
  }
}

}  // namespace siwx::provider
