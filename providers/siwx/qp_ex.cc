// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The extended send API of ibv_wr_post(3): a QP created by ibv_create_qp_ex
// with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS gets the ibv_qp_ex function table
// (ibv_qp_to_qp_ex returns it), and work is built with ibv_wr_start, one
// builder per WR (ibv_wr_send, ...) followed by a data setter, and posted
// with ibv_wr_complete or dropped with ibv_wr_abort.
//
// Operations: SEND, SEND_WITH_INV, RDMA_WRITE, RDMA_READ and LOCAL_INV, the
// ones ibv_post_send serves (qp.cc). Asking at creation for any other
// (atomics, immediate data, memory-window bind, TSO, atomic write, flush)
// fails the create with EOPNOTSUPP, as mlx5 and rxe answer for operations
// they lack. Every entry of the table is filled, so calling a builder or
// setter the QP does not serve never jumps to NULL: it marks the batch
// failed instead.
//
// The builders cannot return an error (ibv_wr_post(3) "RETURN VALUE"), so
// the first one found is kept, the rest of the batch is ignored, and
// ibv_wr_complete returns it and posts nothing of the batch:
//  - EINVAL: a builder for an operation not in send_ops_flags; wr_flags
//    other than FENCE, SIGNALED, SOLICITED (INLINE is ignored: the inline
//    setters choose inline); a setter before any builder or after
//    LOCAL_INV; more SGEs than max_send_sge (or than a Read takes); inline
//    data on a Read or longer than max_inline_data; the UD/XRC setters (an
//    RC QP has no use for them); a nested ibv_wr_start; a QP state that
//    takes no posts (before RTS);
//  - ENOMEM: more WRs than the send queue holds, or no room for the whole
//    batch in the send queue now;
//  - EPERM: a context inherited across fork() (qp.cc).
// The batch is posted all or nothing (engine::Qp::PostSendAll), so a
// failed ibv_wr_complete leaves the send queue as it was.
//
// Concurrency (ibv_wr_post(3) "CONCURRENCY"): ibv_wr_start takes a per-QP
// lock that ibv_wr_complete/ibv_wr_abort release, so the region is one
// thread's at a time. Builders and setters act only for the thread inside
// the region; called outside one they do nothing. ibv_wr_complete outside a
// region returns EINVAL; destroying the QP inside its region drops the
// batch. ibv_post_send is not blocked by the region: the
// two may interleave between regions, as the man page allows.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "common/util/log.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {

struct WrBatch {
  std::mutex region;                     // held from ibv_wr_start to complete/abort
  std::atomic<std::thread::id> owner{};  // the thread inside the region
  // Written only by the owner, inside the region:
  std::vector<engine::SendWorkRequest> wrs;
  int error = 0;                         // the first failure of the batch
  // Fixed at creation:
  std::uint64_t send_ops = 0;            // IBV_QP_EX_WITH_* the QP was created with
  std::uint32_t max_wrs = 0;             // the send queue depth
  std::uint32_t max_sge = 0;             // max_send_sge
  std::uint32_t max_inline = 0;          // max_inline_data
};

namespace {

constexpr std::uint64_t kServedSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
                                         IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
                                         IBV_QP_EX_WITH_LOCAL_INV;
constexpr unsigned int kWrFlags = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
// Past this many records an emptied batch gives its memory back.
constexpr std::size_t kKeptBatchCapacity = 64;

Qp* Of(ibv_qp_ex* qpx) { return reinterpret_cast<Qp*>(qpx); }

// The batch if the calling thread is inside the QP's region, else null.
WrBatch* Region(ibv_qp_ex* qpx) {
  WrBatch* batch = Of(qpx)->wr_batch;
  if (batch == nullptr || batch->owner.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    return nullptr;
  }
  return batch;
}

void Fail(WrBatch& batch, int error) {
  if (batch.error == 0) batch.error = error;
}

// A builder's new record, or null (and the batch marked failed).
engine::SendWorkRequest* Begin(ibv_qp_ex* qpx, std::uint64_t op, engine::SendOpcode opcode) {
  WrBatch* batch = Region(qpx);
  if (batch == nullptr || batch->error != 0) return nullptr;
  if ((batch->send_ops & op) == 0 ||
      (qpx->wr_flags & ~(kWrFlags | static_cast<unsigned int>(IBV_SEND_INLINE))) != 0) {
    Fail(*batch, EINVAL);
    return nullptr;
  }
  if (batch->wrs.size() >= batch->max_wrs) {
    Fail(*batch, ENOMEM);
    return nullptr;
  }
  try {
    batch->wrs.emplace_back();
  } catch (...) {
    Fail(*batch, ENOMEM);
    return nullptr;
  }
  engine::SendWorkRequest& wr = batch->wrs.back();
  wr.wr_id = qpx->wr_id;
  wr.opcode = opcode;
  wr.flags = qpx->wr_flags & kWrFlags;
  return &wr;
}

// The record a setter applies to, or null (and the batch marked failed).
engine::SendWorkRequest* Last(ibv_qp_ex* qpx, WrBatch** batch_out) {
  WrBatch* batch = Region(qpx);
  if (batch == nullptr || batch->error != 0) return nullptr;
  if (batch->wrs.empty() || batch->wrs.back().opcode == engine::SendOpcode::kLocalInvalidate) {
    Fail(*batch, EINVAL);
    return nullptr;
  }
  *batch_out = batch;
  return &batch->wrs.back();
}

// Any entry of the table siwx does not serve, whatever its other parameters
// (deduced from the member it is assigned to).
template <typename... Ignored>
void UnservedEntry(ibv_qp_ex* qpx, Ignored...) {
  if (WrBatch* batch = Region(qpx); batch != nullptr) Fail(*batch, EINVAL);
}

// Builders.
void WrSend(ibv_qp_ex* qpx) { Begin(qpx, IBV_QP_EX_WITH_SEND, engine::SendOpcode::kSend); }

void WrSendInv(ibv_qp_ex* qpx, std::uint32_t invalidate_rkey) {
  if (engine::SendWorkRequest* wr = Begin(qpx, IBV_QP_EX_WITH_SEND_WITH_INV,
                                          engine::SendOpcode::kSendWithInvalidate)) {
    wr->invalidate_stag = invalidate_rkey;
  }
}

void WrRdmaWrite(ibv_qp_ex* qpx, std::uint32_t rkey, std::uint64_t remote_addr) {
  if (engine::SendWorkRequest* wr =
          Begin(qpx, IBV_QP_EX_WITH_RDMA_WRITE, engine::SendOpcode::kRdmaWrite)) {
    wr->rkey = rkey;
    wr->remote_addr = remote_addr;
  }
}

void WrRdmaRead(ibv_qp_ex* qpx, std::uint32_t rkey, std::uint64_t remote_addr) {
  if (engine::SendWorkRequest* wr =
          Begin(qpx, IBV_QP_EX_WITH_RDMA_READ, engine::SendOpcode::kRdmaRead)) {
    wr->rkey = rkey;
    wr->remote_addr = remote_addr;
  }
}

void WrLocalInv(ibv_qp_ex* qpx, std::uint32_t invalidate_rkey) {
  if (engine::SendWorkRequest* wr =
          Begin(qpx, IBV_QP_EX_WITH_LOCAL_INV, engine::SendOpcode::kLocalInvalidate)) {
    wr->invalidate_stag = invalidate_rkey;
  }
}

// Data setters.
void WrSetSgeList(ibv_qp_ex* qpx, std::size_t num_sge, const ibv_sge* sg_list) {
  WrBatch* batch = nullptr;
  engine::SendWorkRequest* wr = Last(qpx, &batch);
  if (wr == nullptr) return;
  const std::uint32_t limit =
      wr->opcode == engine::SendOpcode::kRdmaRead
          ? std::min<std::uint32_t>(batch->max_sge, DeviceLimits::kMaxSgeRead)
          : batch->max_sge;
  if (num_sge > limit || (num_sge > 0 && sg_list == nullptr)) {
    Fail(*batch, EINVAL);
    return;
  }
  wr->flags &= ~static_cast<std::uint32_t>(engine::kSendInline);
  wr->inline_length = 0;
  wr->num_sge = static_cast<std::uint32_t>(num_sge);
  for (std::size_t i = 0; i < num_sge; ++i) {
    wr->sge[i] = {sg_list[i].addr, sg_list[i].length, sg_list[i].lkey};
  }
}

void WrSetSge(ibv_qp_ex* qpx, std::uint32_t lkey, std::uint64_t addr, std::uint32_t length) {
  const ibv_sge sge{addr, length, lkey};
  WrSetSgeList(qpx, 1, &sge);
}

// Copied now: the application may reuse its buffers when the call returns.
void WrSetInlineDataList(ibv_qp_ex* qpx, std::size_t num_buf, const ibv_data_buf* buf_list) {
  WrBatch* batch = nullptr;
  engine::SendWorkRequest* wr = Last(qpx, &batch);
  if (wr == nullptr) return;
  // ibv_wr_post(3): inline is valid only for SEND and RDMA_WRITE.
  if (wr->opcode == engine::SendOpcode::kRdmaRead || (num_buf > 0 && buf_list == nullptr)) {
    Fail(*batch, EINVAL);
    return;
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < num_buf; ++i) {
    total += buf_list[i].length;
    if (total > batch->max_inline) {
      Fail(*batch, EINVAL);
      return;
    }
  }
  std::size_t at = 0;
  for (std::size_t i = 0; i < num_buf; ++i) {
    if (buf_list[i].length == 0) continue;
    std::memcpy(wr->inline_data.data() + at, buf_list[i].addr, buf_list[i].length);
    at += buf_list[i].length;
  }
  wr->flags |= engine::kSendInline;
  wr->inline_length = static_cast<std::uint32_t>(total);
  wr->num_sge = 0;
}

void WrSetInlineData(ibv_qp_ex* qpx, void* addr, std::size_t length) {
  const ibv_data_buf buf{addr, length};
  WrSetInlineDataList(qpx, 1, &buf);
}

// Leaves the region: the batch is emptied and the lock released.
void CloseRegion(WrBatch& batch) {
  batch.wrs.clear();
  if (batch.wrs.capacity() > kKeptBatchCapacity) batch.wrs.shrink_to_fit();
  batch.error = 0;
  batch.owner.store(std::thread::id(), std::memory_order_relaxed);
  batch.region.unlock();
}

void WrStart(ibv_qp_ex* qpx) {
  WrBatch* batch = Of(qpx)->wr_batch;
  if (batch == nullptr) return;
  if (batch->owner.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    Fail(*batch, EINVAL);  // a second start inside the region: the batch fails
    return;
  }
  batch->region.lock();
  batch->owner.store(std::this_thread::get_id(), std::memory_order_relaxed);
  batch->wrs.clear();
  batch->error = 0;
}

int WrComplete(ibv_qp_ex* qpx) {
  WrBatch* batch = Region(qpx);
  if (batch == nullptr) return EINVAL;
  Qp* qp = Of(qpx);
  int error = batch->error;
  if (error == 0 && Inherited(qp->context)) error = EPERM;
  if (error == 0 && !batch->wrs.empty()) {
    engine::PostStatus status;
    try {
      status = qp->shared->engine->PostSendAll(batch->wrs);
    } catch (...) {
      status = engine::PostStatus::kQueueFull;  // out of memory: "not enough resources"
    }
    if (status != engine::PostStatus::kOk) {
      error = status == engine::PostStatus::kQueueFull ? ENOMEM : EINVAL;
    }
  }
  if (error != 0) {
    SIWX_LOG(kDebug, "QP %u: ibv_wr_complete: batch of %zu WRs not posted: %s",
             qpx->qp_base.qp_num, batch->wrs.size(), std::strerror(error));
  }
  CloseRegion(*batch);
  return error;
}

void WrAbort(ibv_qp_ex* qpx) {
  if (WrBatch* batch = Region(qpx); batch != nullptr) CloseRegion(*batch);
}

}  // namespace

int CheckSendOpsFlags(std::uint64_t send_ops_flags) {
  return (send_ops_flags & ~kServedSendOps) != 0 ? EOPNOTSUPP : 0;
}

int EnableSendApi(Qp* qp, std::uint64_t send_ops_flags, const ibv_qp_cap& cap) {
  auto* batch = new (std::nothrow) WrBatch();
  if (batch == nullptr) return ENOMEM;
  batch->send_ops = send_ops_flags;
  batch->max_wrs = cap.max_send_wr;
  batch->max_sge = cap.max_send_sge;
  batch->max_inline = cap.max_inline_data;
  qp->wr_batch = batch;

  ibv_qp_ex& qpx = qp->vqp.qp_ex;
  qpx.comp_mask = 0;
  qpx.wr_id = 0;
  qpx.wr_flags = 0;
  qpx.wr_send = WrSend;
  qpx.wr_send_inv = WrSendInv;
  qpx.wr_rdma_write = WrRdmaWrite;
  qpx.wr_rdma_read = WrRdmaRead;
  qpx.wr_local_inv = WrLocalInv;
  qpx.wr_set_sge = WrSetSge;
  qpx.wr_set_sge_list = WrSetSgeList;
  qpx.wr_set_inline_data = WrSetInlineData;
  qpx.wr_set_inline_data_list = WrSetInlineDataList;
  qpx.wr_start = WrStart;
  qpx.wr_complete = WrComplete;
  qpx.wr_abort = WrAbort;
  // What the QP does not serve: never NULL, each marks the batch failed.
  qpx.wr_atomic_cmp_swp = UnservedEntry;
  qpx.wr_atomic_fetch_add = UnservedEntry;
  qpx.wr_bind_mw = UnservedEntry;
  qpx.wr_rdma_write_imm = UnservedEntry;
  qpx.wr_send_imm = UnservedEntry;
  qpx.wr_send_tso = UnservedEntry;
  qpx.wr_set_ud_addr = UnservedEntry;
  qpx.wr_set_xrc_srqn = UnservedEntry;
#if SIWX_IBV_QP_EX_SIZE >= 352  // rdma-core 44: atomic write
  qpx.wr_atomic_write = UnservedEntry;
#endif
#if SIWX_IBV_QP_EX_SIZE >= 360  // rdma-core 45: flush
  qpx.wr_flush = UnservedEntry;
#endif
  // ibv_qp_to_qp_ex() returns the table only with this bit set.
  qp->vqp.comp_mask |= pabi::kVerbsQpEx;
  return 0;
}

void DisableSendApi(Qp* qp) {
  WrBatch* batch = qp->wr_batch;
  // Destroyed by the thread inside its region: leave it first (a mutex is
  // not destroyed locked). Another thread's open region is the
  // application's use after free, as with any verb on a destroyed QP.
  if (batch != nullptr &&
      batch->owner.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    CloseRegion(*batch);
  }
  delete batch;
  qp->wr_batch = nullptr;
}

}  // namespace siwx::provider
