// Queue pair ops. NOT DONE: they need the engine's QP (common/engine/qp.h,
// being written in parallel). What is here already is the part that does
// not: the argument checks of create_qp / create_qp_ex, with the errno the
// man pages and the kernel give. After the checks, creation fails with
// EOPNOTSUPP, so no siwx QP exists yet, and the ops that take a QP report
// EOPNOTSUPP too.
//
// Completing this file means: a Qp struct embedding pabi::verbs_qp (its
// comp_mask offset is checked in pabi34.h) plus the engine QP; CreateQp
// filling what ibv_cmd_create_qp would (context, qp_context, pd, send_cq,
// recv_cq, srq, qp_type, state = RESET, events_completed, mutex, cond,
// qp_num, handle), taking a unit of Device::qp_count (DeviceLimits::kMaxQp)
// and `users` on the PD, CQs and SRQ (DeallocPd,
// DestroyCq and DestroySrq already refuse with EBUSY while users != 0);
// DestroyQp dropping them, purging and awaiting its async events like
// DestroySrq. post_recv can reuse ToEngine() from srq.cc.
#include <cerrno>

#include "providers/siwx/log.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

// The create checks: 0 or the errno ibv_create_qp fails with.
int CheckInitAttr(ibv_context* context, const ibv_qp_init_attr& attr) {
  // iWARP has reliable connected QPs only (RFC 5040 defines no datagrams).
  if (attr.qp_type != IBV_QPT_RC) return EOPNOTSUPP;
  if (attr.send_cq == nullptr || (attr.recv_cq == nullptr && attr.srq == nullptr)) return EINVAL;
  if (attr.send_cq->context != context ||
      (attr.recv_cq != nullptr && attr.recv_cq->context != context) ||
      (attr.srq != nullptr && attr.srq->context != context)) {
    return EINVAL;
  }
  const ibv_qp_cap& cap = attr.cap;
  if (cap.max_send_wr == 0 || cap.max_send_wr > DeviceLimits::kMaxQpWr ||
      cap.max_send_sge > DeviceLimits::kMaxSge || cap.max_inline_data > DeviceLimits::kMaxInlineData) {
    return EINVAL;
  }
  // ibv_create_qp(3): max_recv_wr and max_recv_sge are ignored with an SRQ.
  if (attr.srq == nullptr &&
      (cap.max_recv_wr > DeviceLimits::kMaxQpWr || cap.max_recv_sge > DeviceLimits::kMaxSge)) {
    return EINVAL;
  }
  return 0;
}

ibv_qp* CreateEngineQp(ibv_pd* /*pd*/, ibv_qp_init_attr* /*attr*/) {
  SIWX_LOG(kWarn, "queue pairs are not available in this build of siwx yet");
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace

ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) noexcept {
  if (attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (int error = CheckInitAttr(pd->context, *attr); error != 0) {
    errno = error;
    return nullptr;
  }
  return CreateEngineQp(pd, attr);
}

ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) noexcept {
  if (attr == nullptr || (attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr ||
      attr->pd->context != context) {
    errno = EINVAL;
    return nullptr;
  }
  // Creation flags, XRC domains, RSS, the ibv_wr_* send API and the other
  // extensions are not offered.
  if ((attr->comp_mask & ~static_cast<std::uint32_t>(IBV_QP_INIT_ATTR_PD)) != 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp_init_attr basic{};
  basic.qp_context = attr->qp_context;
  basic.send_cq = attr->send_cq;
  basic.recv_cq = attr->recv_cq;
  basic.srq = attr->srq;
  basic.cap = attr->cap;
  basic.qp_type = attr->qp_type;
  basic.sq_sig_all = attr->sq_sig_all;
  ibv_qp* qp = CreateQp(attr->pd, &basic);
  if (qp != nullptr) attr->cap = basic.cap;
  return qp;
}

int ModifyQp(ibv_qp* /*qp*/, ibv_qp_attr* /*attr*/, int /*attr_mask*/) noexcept {
  return EOPNOTSUPP;
}

int QueryQp(ibv_qp* /*qp*/, ibv_qp_attr* /*attr*/, int /*attr_mask*/,
            ibv_qp_init_attr* /*init_attr*/) noexcept {
  return EOPNOTSUPP;
}

int DestroyQp(ibv_qp* /*qp*/) noexcept { return EOPNOTSUPP; }

int PostSend(ibv_qp* /*qp*/, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
  if (bad_wr != nullptr) *bad_wr = wr;
  return EOPNOTSUPP;
}

int PostRecv(ibv_qp* /*qp*/, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
  if (bad_wr != nullptr) *bad_wr = wr;
  return EOPNOTSUPP;
}

}  // namespace siwx::provider
