// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, QPs: rdma_init_qp_attr, rdma_create_qp(_ex) with the CQs
// librdmacm creates, rdma_destroy_qp, and rdma_create_ep's deferred QP.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"

namespace siwx::cm {

// ---- QPs ----

int Core::InitQpAttr(rdma_cm_id* pub, ibv_qp_attr* attr, int* mask) {
  if (attr == nullptr || mask == nullptr) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  attr->port_num = id->pub.port_num != 0 ? id->pub.port_num : 1;
  // What the kernel's iw_cm answers: access flags for INIT, the state alone
  // (plus the port) for RTR and RTS.
  switch (EnumValue(attr->qp_state)) {
    case IBV_QPS_INIT:
      attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
      return 0;
    case IBV_QPS_RTR:
    case IBV_QPS_RTS:
      *mask = IBV_QP_STATE | IBV_QP_PORT;
      return 0;
    default: return EINVAL;
  }
}

int Core::CreateQpEx(rdma_cm_id* pub, ibv_qp_init_attr_ex* attr) {
  if (attr == nullptr) return EINVAL;
  ibv_context* verbs;
  ibv_pd* shared_pd;
  ibv_srq* srq;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->pub.qp != nullptr) return EINVAL;
    verbs = id->pub.verbs;
    shared_pd = id->pub.pd;
    srq = id->pub.srq;
  }
  if (verbs == nullptr) return EINVAL;  // no device (CM-only mode, or not bound yet)
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr) {
    attr->pd = shared_pd;
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (attr->pd == nullptr || attr->pd->context != verbs) return EINVAL;
  // As librdmacm: the id's SRQ (rdma_create_srq) serves a QP given none.
  if (attr->srq == nullptr) attr->srq = srq;

  // As stock librdmacm: CQs (each with its own completion channel) for the
  // queues the caller left without one.
  ibv_comp_channel* send_channel = nullptr;
  ibv_comp_channel* recv_channel = nullptr;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  auto cleanup = [&] {
    if (send_cq != nullptr) ibv_destroy_cq(send_cq);
    if (recv_cq != nullptr) ibv_destroy_cq(recv_cq);
    if (send_channel != nullptr) ibv_destroy_comp_channel(send_channel);
    if (recv_channel != nullptr) ibv_destroy_comp_channel(recv_channel);
  };
  errno = 0;
  // A CQ with its own completion channel, for a queue the caller gave none.
  auto make_cq = [&](ibv_comp_channel*& channel, ibv_cq*& cq, std::uint32_t depth) {
    channel = ibv_create_comp_channel(verbs);
    if (channel != nullptr) {
      const int entries = static_cast<int>(std::max<std::uint32_t>(depth, 1));
      cq = ibv_create_cq(verbs, entries, pub, channel, 0);
    }
    return cq != nullptr;
  };
  if (attr->recv_cq == nullptr) {
    if (!make_cq(recv_channel, recv_cq, attr->cap.max_recv_wr)) {
      const int err = errno != 0 ? errno : ENOMEM;
      cleanup();
      return err;
    }
    attr->recv_cq = recv_cq;
  }
  if (attr->send_cq == nullptr) {
    if (!make_cq(send_channel, send_cq, attr->cap.max_send_wr)) {
      const int err = errno != 0 ? errno : ENOMEM;
      cleanup();
      return err;
    }
    attr->send_cq = send_cq;
  }
  ibv_qp* qp = ibv_create_qp_ex(verbs, attr);
  if (qp == nullptr) {
    const int err = errno != 0 ? errno : ENOMEM;
    if (send_cq != nullptr) attr->send_cq = nullptr;
    if (recv_cq != nullptr) attr->recv_cq = nullptr;
    cleanup();
    return err;
  }
  ibv_qp_attr qp_attr{};
  qp_attr.qp_state = IBV_QPS_INIT;
  int mask = 0;
  int rc = InitQpAttr(pub, &qp_attr, &mask);
  if (rc == 0) rc = ibv_modify_qp(qp, &qp_attr, mask);
  if (rc != 0) {
    ibv_destroy_qp(qp);
    cleanup();
    return rc;
  }
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) {  // destroyed meanwhile: undo
    ibv_destroy_qp(qp);
    cleanup();
    return EINVAL;
  }
  id->pub.qp = qp;
  id->pub.pd = qp->pd;  // as librdmacm: rdma_reg_msgs and friends use it
  id->own_qp_num = qp->qp_num;
  if (send_cq != nullptr) {
    id->pub.send_cq = send_cq;
    id->pub.send_cq_channel = send_channel;
  }
  if (recv_cq != nullptr) {
    id->pub.recv_cq = recv_cq;
    id->pub.recv_cq_channel = recv_channel;
  }
  return 0;
}

void Core::DestroyQp(rdma_cm_id* pub) {
  ibv_qp* qp;
  ibv_cq* cqs[2];
  ibv_comp_channel* channels[2];
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return;
    qp = id->pub.qp;
    id->pub.qp = nullptr;
    cqs[0] = id->pub.send_cq;
    cqs[1] = id->pub.recv_cq;
    channels[0] = id->pub.send_cq_channel;
    channels[1] = id->pub.recv_cq_channel;
    id->pub.send_cq = id->pub.recv_cq = nullptr;
    id->pub.send_cq_channel = id->pub.recv_cq_channel = nullptr;
  }
  if (qp != nullptr) ibv_destroy_qp(qp);
  for (ibv_cq* cq : cqs) {
    if (cq != nullptr) ibv_destroy_cq(cq);
  }
  for (ibv_comp_channel* ch : channels) {
    if (ch != nullptr) ibv_destroy_comp_channel(ch);
  }
}

int Core::SetEpQpInitAttr(rdma_cm_id* pub, const ibv_qp_init_attr& attr, ibv_pd* pd) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  id->ep_qp_init_attr = attr;
  if (pd != nullptr) id->pub.pd = pd;
  return 0;
}

void Core::ClearEpQpInitAttr(rdma_cm_id* pub) {
  std::lock_guard lock(mu_);
  if (CmId* id = FindId(pub)) id->ep_qp_init_attr.reset();
}

}  // namespace siwx::cm
