// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The siwx libibverbs provider: verbs objects on top of engine objects.
//
// Every object libibverbs hands to applications embeds its libibverbs base
// as the first member and is reached back with ToSiwx(). The structs stay
// standard-layout (static_asserts) so that conversion is well defined; the
// C++ state they own is held through plain pointers created and destroyed by
// the ops in this directory.
//
// Files: device.cc (device and context, queries, the ops table and driver
// registration), memory.cc (PD, MR), completion.cc (CQ, completion
// channel), srq.cc (SRQ), qp.cc (QP ops), async.cc (async events),
// stream.cc (siwxdv.h: the handover of a connected stream to a QP).
//
// Error convention of the ops (ibv_*(3) and the kernel's uverbs): creators
// return NULL with errno set; int-returning ops return 0 or a positive errno;
// poll_cq returns a negative value; post_* return a positive errno and set
// *bad_wr. No op lets an exception escape.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/engine/completion.h"
#include "common/engine/engine.h"
#include "common/engine/memory.h"
#include "common/engine/receive_queue.h"
#include "common/engine/work_request.h"
#include "providers/siwx/event_queue.h"
#include "providers/siwx/identity.h"
#include "providers/siwx/pabi34.h"
#include "providers/siwx/siwx_provider.h"
#include "providers/siwx/siwxdv.h"

namespace siwx::provider {

// What query_device_ex reports, and what the ops enforce.
struct DeviceLimits {
  static constexpr std::uint32_t kPortCount = 1;
  static constexpr std::uint32_t kMaxQp = 1u << 16;
  static constexpr std::uint32_t kMaxCq = 1u << 16;
  static constexpr std::uint32_t kMaxSrq = 1u << 16;
  static constexpr std::uint32_t kMaxPd = 1u << 16;
  // Per context: each context has its own STag table.
  static constexpr std::uint32_t kMaxMr = 1u << 20;
  static constexpr std::uint32_t kMaxQpWr = engine::kMaxQueueDepth;
  static constexpr std::uint32_t kMaxSge = engine::kMaxSge;
  // An RDMA Read Request names one Data Sink (RFC 5040 4.4).
  static constexpr std::uint32_t kMaxSgeRead = engine::kMaxReadSge;
  static constexpr std::uint32_t kMaxCqe = engine::CompletionQueue::kMaxCapacity;
  static constexpr std::uint32_t kMaxSrqWr = engine::kMaxQueueDepth;
  static constexpr std::uint32_t kMaxSrqSge = engine::kMaxSge;
  static constexpr std::uint32_t kMaxInlineData = engine::kMaxInlineData;
  // Outstanding RDMA Reads per QP, as responder (IRD) and requester (ORD);
  // the MPA v2 IRD/ORD word carries 14 bits each (RFC 6581 9); we stay at
  // siw's 128.
  static constexpr std::uint32_t kMaxIrd = 128;
  static constexpr std::uint32_t kMaxOrd = 128;
  static constexpr std::uint32_t kGidTableLength = 1;
  static constexpr std::uint32_t kPkeyTableLength = 1;
  static constexpr std::uint16_t kDefaultPkey = 0xFFFF;  // full member, default partition
  static constexpr std::uint32_t kCompVectors = 1;
};

// Event record sizes: struct ib_uverbs_comp_event_desc {u64 cq_handle} and
// struct ib_uverbs_async_event_desc {u64 element; u32 event_type; u32 reserved},
// the records ibv_get_cq_event / ibv_get_async_event read.
inline constexpr std::size_t kCompRecordSize = 8;
inline constexpr std::size_t kAsyncRecordSize = 16;

// Not an IEEE OUI: "swx" in ASCII, as siw uses "bmt". Any value but AWS's
// 0x1d0f is fine for libfabric, which skips EFA by vendor id.
inline constexpr std::uint32_t kVendorId = 0x737778;
inline constexpr std::uint32_t kVendorPartId = 1;

struct Context;

// One per network interface, created by the kernel shim and never freed (it
// keeps a reference). Port data changes with the link; the object budgets
// (max_pd, max_cq, max_srq, max_qp) are device-wide like a kernel device's.
struct Device {
  pabi::verbs_device vdev;  // first: what libibverbs sees
  Guid node_guid;           // fixed at creation
  Guid system_image_guid;
  std::atomic<std::uint32_t> pd_count;
  std::atomic<std::uint32_t> cq_count;
  std::atomic<std::uint32_t> srq_count;
  std::atomic<std::uint32_t> qp_count;
  std::mutex mutex;                 // guards port and contexts
  siwx_port_desc port;              // guarded by mutex
  std::vector<Context*> contexts;   // guarded by mutex; open contexts
};

// What one open device context owns besides libibverbs' part: the engine
// (PDs and MRs in its MemoryTable, the QPs, the progress thread), the async
// event fd, and the qp_num -> Qp map that turns the engine's async events
// (which name a qp_num) into records about an ibv_qp.
//
// `engine` is declared last so that it is destroyed first: its progress
// thread calls back into `qps` and `async_events` until it has stopped.
// A process-wide counter for identities that must never be reused.
std::uint64_t NextObjectId();

struct Qp;
struct ContextState {
  engine::MemoryTable& memory() { return engine->memory(); }

  Device* device = nullptr;
  std::unique_ptr<EventQueue> async_events;  // 16-byte records on ctx->async_fd
  std::mutex qp_mutex;  // guards qps; held while an event of one of them is posted
  std::unordered_map<std::uint32_t, Qp*> qps;  // guarded by qp_mutex; live QPs by qp_num
  std::uint32_t fork_generation = 0;  // ForkGeneration() when the context was opened
  // Unique in the process, never reused: how the out-of-band connect's
  // threads find the context again without holding a pointer (oob.cc).
  std::uint64_t id = NextObjectId();
  std::unique_ptr<engine::Engine> engine;
};

// An open device (ibv_open_device). Objects left alive at ibv_close_device
// are not reclaimed (a kernel would); the application owns them.
struct Context {
  verbs_context vctx;  // first; the block is calloc'ed by libibverbs
  ContextState* state;
};

// A protection domain: an engine PdId; the MRs in it live in the context's
// MemoryTable, which refuses to drop a PD that still has regions.
struct Pd {
  ibv_pd base;
  engine::PdId id;
  std::atomic<std::uint32_t> users;  // SRQs and QPs created in this PD
};

// A completion channel (see completion.cc): base.fd is the read end of
// `events`. libibverbs counts its CQs in base.refcnt.
struct CompChannel {
  ibv_comp_channel base;
  std::uint32_t magic;  // kCompChannelMagic while alive
  EventQueue* events;   // owned; 8-byte CQ pointers on base.fd
};
inline constexpr std::uint32_t kCompChannelMagic = 0x73774343;  // "swCC"

// A CQ: an engine CompletionQueue plus the event bookkeeping destroy needs.
// Extended CQs (ibv_create_cq_ex) are not offered.
struct Cq {
  pabi::verbs_cq vcq;
  Context* context;
  CompChannel* channel;                // may be null
  engine::CompletionQueue* queue;      // owned
  std::atomic<std::uint32_t> comp_events_posted;
  std::atomic<std::uint32_t> async_events_posted;
  std::atomic<std::uint32_t> users;    // QPs that use it as send or receive CQ
};

// A basic SRQ (no XRC): an engine ReceiveQueue of kind kShared.
struct Srq {
  pabi::verbs_srq vsrq;
  Context* context;
  Pd* pd;
  engine::ReceiveQueue* queue;         // owned
  std::atomic<std::uint32_t> events_posted;
  std::atomic<std::uint32_t> users;    // QPs attached to it
};

// The C++ side of a QP (qp.cc): the engine QP, and what verbs and the stream
// handover (siwxdv.h, stream.cc) keep about it besides the engine's state.
struct QpShared {
  std::shared_ptr<engine::Qp> engine;   // set at creation; the QP's own reference
  std::mutex mutex;                     // guards the fields below
  unsigned int access_flags = 0;        // IBV_QP_ACCESS_FLAGS as last modified
  std::uint8_t max_rd_atomic = 0;       // IBV_QP_MAX_QP_RD_ATOMIC (ORD) as last modified
  std::uint8_t max_dest_rd_atomic = 0;  // IBV_QP_MAX_DEST_RD_ATOMIC (IRD) as last modified
  std::uint8_t timeout = 0;             // IBV_QP_TIMEOUT as last modified
  std::uint8_t retry_cnt = 0;           // IBV_QP_RETRY_CNT as last modified
  bool notify_pending = false;          // the end of the bound stream is still to be reported
  siwx_stream_notify notify{};          // valid while notify_pending
  // Out-of-band connect (oob.h, docs/out-of-band-connect.md).
  const std::uint64_t token = NextObjectId();  // identity of this QP for oob.cc's threads
  bool oob_armed = false;         // RTR named a siwx GID and a destination QP
  bool oob_dialer = false;        // armed, and this end connects
  bool oob_cm_bound = false;      // the CM bound a stream: never out of band
  GidBytes oob_local_gid{};       // armed: our GID as the peer knows it
  GidBytes oob_remote_gid{};      // armed: the peer's GID (IBV_QP_AV grh.dgid)
  std::uint32_t oob_remote_qpn = 0;  // armed: IBV_QP_DEST_QPN
  // A stream the device listener accepted for this QP before it was armed
  // (the peer reached RTR first); bound when RTR names that peer.
  int oob_parked_fd = -1;
  siwx_stream_params oob_parked_params{};
  std::uint32_t oob_parked_peer_qpn = 0;
  GidBytes oob_parked_peer_gid{};
};

// The ibv_wr_* batch of a QP that has the extended send API (qp_ex.cc).
struct WrBatch;

// A reliable connected QP. One created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
// also has the ibv_qp_ex send API (qp_ex.cc): vqp.comp_mask says so, and
// wr_batch holds its work between ibv_wr_start and ibv_wr_complete. Other
// QPs have comp_mask 0, so ibv_qp_to_qp_ex() returns NULL for them.
struct Qp {
  pabi::verbs_qp vqp;
  Context* context;
  Pd* pd;
  Cq* send_cq;
  Cq* recv_cq;
  Srq* srq;          // may be null
  QpShared* shared;  // owned
  std::atomic<std::uint32_t> events_posted;  // async events posted about it
  WrBatch* wr_batch;  // owned; null without the extended send API
};

static_assert(std::is_standard_layout_v<Device> && offsetof(Device, vdev) == 0);
static_assert(std::is_standard_layout_v<Context> && offsetof(Context, vctx) == 0);
static_assert(std::is_standard_layout_v<Pd> && offsetof(Pd, base) == 0);
static_assert(std::is_standard_layout_v<CompChannel> && offsetof(CompChannel, base) == 0);
static_assert(std::is_standard_layout_v<Cq> && offsetof(Cq, vcq) == 0);
static_assert(std::is_standard_layout_v<Srq> && offsetof(Srq, vsrq) == 0);
static_assert(std::is_standard_layout_v<Qp> && offsetof(Qp, vqp) == 0);

// Base -> siwx object. Only valid for objects this provider created.
inline Device* ToSiwx(ibv_device* d) { return reinterpret_cast<Device*>(d); }
inline Context* ToSiwx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Pd* ToSiwx(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline CompChannel* ToSiwx(ibv_comp_channel* c) { return reinterpret_cast<CompChannel*>(c); }
inline Cq* ToSiwx(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Srq* ToSiwx(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Qp* ToSiwx(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }

// The ops table's device ops, for ownership tests.
extern const pabi::verbs_device_ops kDeviceOps;
bool IsSiwxDevice(const ibv_device* device);
bool IsSiwxContext(const ibv_context* context);

// Async events (async.cc). Posts one record on the context's async_fd.
void PostAsyncEvent(Context* context, std::uint64_t element, ibv_event_type type);
// Removes unread async events about `element` of the given types; returns
// how many it removed.
std::size_t PurgeAsyncEvents(Context* context, std::uint64_t element,
                             std::initializer_list<ibv_event_type> types);
// Blocks until the application acknowledged `reported` events of the object:
// *completed (guarded by mutex, signalled on cond by ibv_ack_*_events).
void WaitForAcks(pthread_mutex_t* mutex, pthread_cond_t* cond, const std::uint32_t* completed,
                 std::uint32_t reported);

// Ops, by file.
int QueryDeviceEx(ibv_context* context, const ibv_query_device_ex_input* input,
                  ibv_device_attr_ex* attr, std::size_t attr_size) noexcept;
int QueryPort(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr) noexcept;
void FreeContext(ibv_context* context) noexcept;
void AsyncEvent(ibv_context* context, ibv_async_event* event) noexcept;

ibv_pd* AllocPd(ibv_context* context) noexcept;
int DeallocPd(ibv_pd* pd) noexcept;
ibv_mr* RegMr(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova,
              int access) noexcept;
int DeregMr(pabi::verbs_mr* vmr) noexcept;

ibv_cq* CreateCq(ibv_context* context, int cqe, ibv_comp_channel* channel,
                 int comp_vector) noexcept;
int DestroyCq(ibv_cq* cq) noexcept;
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) noexcept;
int ReqNotifyCq(ibv_cq* cq, int solicited_only) noexcept;
void CqEvent(ibv_cq* cq) noexcept;
ibv_comp_channel* CreateCompChannel(ibv_context* context) noexcept;
int DestroyCompChannel(ibv_comp_channel* channel) noexcept;

ibv_srq* CreateSrq(ibv_pd* pd, ibv_srq_init_attr* init_attr) noexcept;
int ModifySrq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) noexcept;
int QuerySrq(ibv_srq* srq, ibv_srq_attr* attr) noexcept;
int DestroySrq(ibv_srq* srq) noexcept;
int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept;

ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) noexcept;
ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) noexcept;
int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) noexcept;
int QueryQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) noexcept;
int DestroyQp(ibv_qp* qp) noexcept;
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept;
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept;

// The extended send API (qp_ex.cc). CheckSendOpsFlags: 0, or EOPNOTSUPP for
// an operation siwx does not serve. EnableSendApi fills the QP's ibv_qp_ex
// table for the granted capacities: 0 or ENOMEM. DisableSendApi frees it.
int CheckSendOpsFlags(std::uint64_t send_ops_flags);
int EnableSendApi(Qp* qp, std::uint64_t send_ops_flags, const ibv_qp_cap& cap);
void DisableSendApi(Qp* qp);

// The engine's async events for the context's QPs (EngineConfig callback):
// QP events go to the async fd, the end of a stream to the CM's notify.
void OnEngineEvent(Context* context, const engine::AsyncEvent& event);
// The live QP with this qp_num, or null.
Qp* FindQp(Context* context, std::uint32_t qp_num);

// fork(): as with rdma-core's fork support, a child process must not use
// the verbs objects it inherited. They share the parent's TCP streams (an
// FPDU the child sent would corrupt the parent's stream) and the child has
// none of the engine's threads. ForkGeneration() counts the forks this
// process descends from; posting, polling and the stream handover on a
// context opened before the latest one are refused with EPERM.
//
// Destroying an inherited object (ibv_dereg_mr, ibv_destroy_qp, _cq, _srq,
// ibv_dealloc_pd, ibv_close_device) succeeds at once and only forgets it:
// its engine state may be mid-operation in a thread the child does not
// have (a region held for a copy, a lock taken, a command never served), so
// the child takes no engine lock and waits for no engine thread. Its memory
// is the child's copy and goes when the child exits or execs.
std::uint32_t ForkGeneration();
inline bool Inherited(const Context* context) {
  return context->state->fork_generation != ForkGeneration();
}

// siwx_qp_bind_stream_num without the exported wrapper (stream.cc); the
// out-of-band connect binds through it too.
int BindStream(Context* context, std::uint32_t qp_num, int fd, const siwx_stream_params* params,
               const siwx_stream_notify* notify);

// Receive WR conversion shared by post_srq_recv and post_recv:
// EINVAL for a negative or too large num_sge or a missing sg_list.
int ToEngine(const ibv_recv_wr& wr, std::uint32_t max_sge, engine::ReceiveWorkRequest* out);

// Takes one unit of a device-wide object budget; false when exhausted.
bool TakeBudget(std::atomic<std::uint32_t>& count, std::uint32_t limit);
inline void ReturnBudget(std::atomic<std::uint32_t>& count) {
  count.fetch_sub(1, std::memory_order_relaxed);
}

// A numeric SIWX_* setting (docs/settings.txt): `fallback` when `name` is
// unset or empty; also when it is not a whole number in [min, max], with a
// warning that names the setting, its `unit` and the value used.
long NumericSetting(const char* name, long min, long max, long fallback, const char* unit);

}  // namespace siwx::provider
