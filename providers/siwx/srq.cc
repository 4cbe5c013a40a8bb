// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Shared receive queues: verbs objects over engine::ReceiveQueue (kind
// kShared). The limit event (ibv_modify_srq with IBV_SRQ_LIMIT) arrives from
// the engine as a callback and goes out as IBV_EVENT_SRQ_LIMIT_REACHED on the
// context's async fd.
//
// Rules (ibv_create_srq(3), ibv_modify_srq(3), and the kernel siw driver
// where the man pages are silent):
//  - create: 1 <= max_wr <= max_srq_wr and max_sge <= max_srq_sge, else
//    EINVAL; srq_limit is ignored; the actual sizes are written back;
//  - modify: IBV_SRQ_LIMIT arms (0 disarms), above max_wr is EINVAL;
//    IBV_SRQ_MAX_WR (resize) is EOPNOTSUPP, the device does not advertise
//    IBV_DEVICE_SRQ_RESIZE; unknown mask bits are EINVAL; on error nothing
//    changes;
//  - destroy: EBUSY while QPs use the SRQ; otherwise unread limit events are
//    taken back and acknowledged ones awaited (see async.cc);
//  - post_srq_recv: EINVAL for too many SGEs, ENOMEM when the queue is full;
//    *bad_wr is the first WR not posted.
#include <cerrno>
#include <new>

#include "providers/siwx/provider.h"

namespace siwx::provider {

int ToEngine(const ibv_recv_wr& wr, std::uint32_t max_sge, engine::ReceiveWorkRequest* out) {
  if (wr.num_sge < 0 || static_cast<std::uint32_t>(wr.num_sge) > max_sge ||
      static_cast<std::uint32_t>(wr.num_sge) > engine::kMaxSge) {
    return EINVAL;
  }
  if (wr.num_sge > 0 && wr.sg_list == nullptr) return EINVAL;
  out->wr_id = wr.wr_id;
  out->num_sge = static_cast<std::uint32_t>(wr.num_sge);
  for (int i = 0; i < wr.num_sge; ++i) {
    out->sge[static_cast<std::size_t>(i)] = {wr.sg_list[i].addr, wr.sg_list[i].length,
                                             wr.sg_list[i].lkey};
  }
  return 0;
}

ibv_srq* CreateSrq(ibv_pd* ibpd, ibv_srq_init_attr* init_attr) noexcept {
  if (init_attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  const ibv_srq_attr& want = init_attr->attr;
  if (want.max_wr == 0 || want.max_wr > DeviceLimits::kMaxSrqWr ||
      want.max_sge > DeviceLimits::kMaxSrqSge) {
    errno = EINVAL;
    return nullptr;
  }
  Pd* pd = ToSiwx(ibpd);
  Context* context = ToSiwx(ibpd->context);
  Device* device = context->state->device;
  if (!TakeBudget(device->srq_count, DeviceLimits::kMaxSrq)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* srq = new (std::nothrow) Srq();
  if (srq == nullptr) {
    ReturnBudget(device->srq_count);
    errno = ENOMEM;
    return nullptr;
  }
  srq->context = context;
  srq->pd = pd;
  std::unique_ptr<engine::ReceiveQueue> queue;
  try {
    const engine::QueueCaps caps{want.max_wr, want.max_sge, 0};
    queue = engine::ReceiveQueue::Create(engine::ReceiveQueue::Kind::kShared, caps, [srq] {
      srq->events_posted.fetch_add(1);
      PostAsyncEvent(srq->context, reinterpret_cast<std::uintptr_t>(&srq->vsrq.srq),
                     IBV_EVENT_SRQ_LIMIT_REACHED);
    });
  } catch (...) {
    queue.reset();
  }
  if (queue == nullptr) {
    delete srq;
    ReturnBudget(device->srq_count);
    errno = ENOMEM;
    return nullptr;
  }
  srq->queue = queue.release();
  srq->vsrq.srq_type = IBV_SRQT_BASIC;
  pd->users.fetch_add(1);
  init_attr->attr.max_wr = srq->queue->caps().max_wr;
  init_attr->attr.max_sge = srq->queue->caps().max_sge;
  init_attr->attr.srq_limit = 0;
  // libibverbs sets context, srq_context, pd, events_completed, mutex, cond.
  return &srq->vsrq.srq;
}

int ModifySrq(ibv_srq* ibsrq, ibv_srq_attr* attr, int attr_mask) noexcept {
  if (attr == nullptr) return EINVAL;
  if ((attr_mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) != 0) return EINVAL;
  if ((attr_mask & IBV_SRQ_MAX_WR) != 0) return EOPNOTSUPP;
  if ((attr_mask & IBV_SRQ_LIMIT) != 0) {
    switch (ToSiwx(ibsrq)->queue->SetLimit(attr->srq_limit)) {
      case engine::SrqLimitStatus::kOk:
        break;
      case engine::SrqLimitStatus::kInvalidLimit:
      case engine::SrqLimitStatus::kNotShared:
        return EINVAL;
    }
  }
  return 0;
}

int QuerySrq(ibv_srq* ibsrq, ibv_srq_attr* attr) noexcept {
  if (attr == nullptr) return EINVAL;
  const engine::ReceiveQueue& queue = *ToSiwx(ibsrq)->queue;
  attr->max_wr = queue.caps().max_wr;
  attr->max_sge = queue.caps().max_sge;
  attr->srq_limit = queue.limit();
  return 0;
}

int DestroySrq(ibv_srq* ibsrq) noexcept {
  Srq* srq = ToSiwx(ibsrq);
  if (Inherited(srq->context)) return 0;  // forgotten (provider.h, fork())
  if (srq->users.load() != 0) return EBUSY;
  delete srq->queue;  // no QP uses it, so no engine thread takes from it
  srq->queue = nullptr;
  const std::size_t purged =
      PurgeAsyncEvents(srq->context, reinterpret_cast<std::uintptr_t>(ibsrq),
                       {IBV_EVENT_SRQ_LIMIT_REACHED, IBV_EVENT_SRQ_ERR});
  WaitForAcks(&ibsrq->mutex, &ibsrq->cond, &ibsrq->events_completed,
              srq->events_posted.load() - static_cast<std::uint32_t>(purged));
  srq->pd->users.fetch_sub(1);
  ReturnBudget(srq->context->state->device->srq_count);
  delete srq;
  return 0;
}

int PostSrqRecv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
  if (Inherited(ToSiwx(ibsrq)->context)) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return EPERM;
  }
  engine::ReceiveQueue& queue = *ToSiwx(ibsrq)->queue;
  engine::ReceiveWorkRequest record;
  for (ibv_recv_wr* current = wr; current != nullptr; current = current->next) {
    int error = ToEngine(*current, queue.caps().max_sge, &record);
    if (error == 0) {
      engine::PostStatus status;
      try {
        status = queue.Post(record);
      } catch (...) {
        status = engine::PostStatus::kQueueFull;
      }
      if (status == engine::PostStatus::kQueueFull) {
        error = ENOMEM;
      } else if (status != engine::PostStatus::kOk) {
        error = EINVAL;
      }
    }
    if (error != 0) {
      if (bad_wr != nullptr) *bad_wr = current;
      return error;
    }
  }
  return 0;
}

}  // namespace siwx::provider
