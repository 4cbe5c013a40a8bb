// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Devices and contexts: the driver registration, the ops table, device and
// port queries, and the exported API the kernel shim uses to create devices.
//
// siwx devices are created by the shim (siwx_create_device), one per network
// interface, with sysfs == NULL; libibverbs opens them through
// verbs_open_device(), which works for such devices from rdma-core v37. The
// registered driver matches no kernel device: a kernel-less host never
// offers one, and a host with a kernel has its own drivers for its devices.
#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/util/log.h"
#include "providers/siwx/oob.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {

namespace {

std::atomic<std::uint32_t> g_fork_generation{0};
// Registered when the provider is loaded; the child of every later fork()
// sees a new generation.
[[maybe_unused]] const int kForkHandler = pthread_atfork(
    nullptr, nullptr, [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });

}  // namespace

std::uint32_t ForkGeneration() { return g_fork_generation.load(std::memory_order_relaxed); }
namespace {

constexpr const char* kFirmwareVersion = "siwx 0.1";
constexpr std::uint8_t kPortNum = 1;

bool MatchDevice(pabi::verbs_sysfs_dev* /*sysfs_dev*/) noexcept { return false; }

pabi::verbs_device* AllocDevice(pabi::verbs_sysfs_dev* /*sysfs_dev*/) noexcept {
  return nullptr;  // never called: MatchDevice claims nothing
}

void UninitDevice(pabi::verbs_device* vdev) noexcept { delete reinterpret_cast<Device*>(vdev); }

}  // namespace

long NumericSetting(const char* name, long min, long max, long fallback, const char* unit) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || n < min || n > max) {
    SIWX_LOG(kWarn, "%s='%s' is not a number of %s in %ld..%ld; using %ld", name, value, unit,
             min, max, fallback);
    return fallback;
  }
  return n;
}

namespace {

// SIWX_TEARDOWN_TIMEOUT_MS (README, Configuration), read once per process:
// how long a stream that is ending may take to get its Terminate or FIN out
// and see the peer close before it is reset (engine::EngineConfig).
std::chrono::milliseconds TeardownTimeout() {
  static const std::chrono::milliseconds timeout(
      NumericSetting("SIWX_TEARDOWN_TIMEOUT_MS", 1, 600000,
                     static_cast<long>(engine::kDefaultTeardownTimeout.count()), "milliseconds"));
  return timeout;
}

// SIWX_PROGRESS_SPIN_US (README, Configuration), read once per process: how
// long the progress thread may poll before it sleeps (engine::EngineConfig).
std::chrono::microseconds ProgressSpin() {
  const long max = static_cast<long>(engine::kMaxProgressSpin.count());
  static const std::chrono::microseconds spin(
      NumericSetting("SIWX_PROGRESS_SPIN_US", 0, max, 0, "microseconds"));
  return spin;
}

// SIWX_TX_COALESCE_KIB (README, Configuration), read once per process: up to
// how many KiB of back-to-back posts share one sendmsg (engine::EngineConfig;
// 0: every post transmits at once).
std::size_t TxCoalesceOctets() {
  static const std::size_t octets =
      static_cast<std::size_t>(NumericSetting(
          "SIWX_TX_COALESCE_KIB", 0, static_cast<long>(engine::kMaxTxCoalesceOctets >> 10),
          static_cast<long>(engine::kDefaultTxCoalesceOctets >> 10), "KiB"))
      << 10;
  return octets;
}

// SIWX_RESPONDER_SPIN_US (README, Configuration), read once per process: how
// long the progress thread may poll before it sleeps while it answers small
// Read Requests itself (engine/responder_spin.h; 0: never).
std::chrono::microseconds ResponderSpin() {
  const long max = static_cast<long>(engine::kMaxProgressSpin.count());
  static const std::chrono::microseconds spin(NumericSetting(
      "SIWX_RESPONDER_SPIN_US", 0, max,
      static_cast<long>(engine::ResponderSpin::kDefaultMax.count()), "microseconds"));
  return spin;
}

// SIWX_ANSWER_SPIN_US (README, Configuration), read once per process: how
// long a poll returning a ping-pong post's completion may read the stream
// for its answer (Qp::AwaitAnswer; 0: never).
std::chrono::microseconds AnswerSpin() {
  static const std::chrono::microseconds spin(NumericSetting(
      "SIWX_ANSWER_SPIN_US", 0, static_cast<long>(engine::kMaxAnswerSpin.count()),
      static_cast<long>(engine::kDefaultAnswerSpin.count()), "microseconds"));
  return spin;
}

// SIWX_PROGRESS_AFFINITY (README, Configuration), read once per process:
// whether the progress thread keeps off the application's CPU
// (engine/placement.h).
engine::ProgressAffinity ProgressAffinity() {
  static const engine::ProgressAffinity affinity = [] {
    const char* value = std::getenv("SIWX_PROGRESS_AFFINITY");
    if (value == nullptr || value[0] == '\0' || std::strcmp(value, "away") == 0) {
      return engine::ProgressAffinity::kAway;
    }
    if (std::strcmp(value, "any") == 0) return engine::ProgressAffinity::kAny;
    SIWX_LOG(kWarn, "SIWX_PROGRESS_AFFINITY='%s' is neither 'away' nor 'any'; using 'away'",
             value);
    return engine::ProgressAffinity::kAway;
  }();
  return affinity;
}

verbs_context* AllocContext(ibv_device* ibdev, int cmd_fd, void* private_data) noexcept;

}  // namespace

const pabi::verbs_device_ops kDeviceOps = {
    .name = "siwx",
    .match_min_abi_version = 0,
    .match_max_abi_version = UINT32_MAX,
    .match_table = nullptr,
    .static_providers = nullptr,
    .match_device = MatchDevice,
    .alloc_context = AllocContext,
    .import_context = nullptr,
    .alloc_device = AllocDevice,
    .uninit_device = UninitDevice,
};

namespace {

// Alphabetical, as in driver.h. Unset ops keep libibverbs' dummies, which
// fail with EOPNOTSUPP.
constexpr pabi::verbs_context_ops MakeContextOps() {
  pabi::verbs_context_ops ops{};
  ops.alloc_pd = AllocPd;
  ops.async_event = AsyncEvent;
  ops.cq_event = CqEvent;
  ops.create_cq = CreateCq;
  ops.create_qp = CreateQp;
  ops.create_qp_ex = CreateQpEx;
  ops.create_srq = CreateSrq;
  ops.dealloc_pd = DeallocPd;
  ops.dereg_mr = DeregMr;
  ops.destroy_cq = DestroyCq;
  ops.destroy_qp = DestroyQp;
  ops.destroy_srq = DestroySrq;
  ops.free_context = FreeContext;
  ops.modify_qp = ModifyQp;
  ops.modify_srq = ModifySrq;
  ops.poll_cq = PollCq;
  ops.post_recv = PostRecv;
  ops.post_send = PostSend;
  ops.post_srq_recv = PostSrqRecv;
  ops.query_device_ex = QueryDeviceEx;
  ops.query_port = QueryPort;
  ops.query_qp = QueryQp;
  ops.query_srq = QuerySrq;
  ops.reg_mr = RegMr;
  ops.req_notify_cq = ReqNotifyCq;
  return ops;
}
constexpr pabi::verbs_context_ops kContextOps = MakeContextOps();

// The constructor rdma-core's PROVIDER_DRIVER() would generate: registration
// only lists the driver; it creates no device.
__attribute__((constructor)) void RegisterDriver() noexcept {
  pabi::verbs_register_driver_34(&kDeviceOps);
}

verbs_context* AllocContext(ibv_device* ibdev, int cmd_fd, void* /*private_data*/) noexcept {
  Device* device = ToSiwx(ibdev);
  if (cmd_fd != -1) {
    // Only a kernel device has a command fd; siwx has no kernel interface.
    errno = EOPNOTSUPP;
    return nullptr;
  }
  auto* context = static_cast<Context*>(pabi::_verbs_init_and_alloc_context(
      ibdev, cmd_fd, sizeof(Context), nullptr /* vctx is at offset 0 */, 0 /* unknown */));
  if (context == nullptr) return nullptr;

  std::unique_ptr<ContextState> state;
  int error = ENOMEM;
  try {
    state = std::make_unique<ContextState>();
    state->device = device;
    state->fork_generation = ForkGeneration();
    state->async_events = EventQueue::Create(kAsyncRecordSize);
    if (state->async_events == nullptr) {
      error = errno;
      state.reset();
    } else {
      // The progress thread's events name a qp_num; qp.cc maps it back.
      engine::EngineConfig config;
      config.on_async_event = [context](const engine::AsyncEvent& event) {
        OnEngineEvent(context, event);
      };
      config.teardown_timeout = TeardownTimeout();
      config.progress_spin = ProgressSpin();
      config.responder_spin = ResponderSpin();
      config.answer_spin = AnswerSpin();
      config.tx_coalesce_octets = TxCoalesceOctets();
      config.progress_affinity = ProgressAffinity();
      errno = 0;
      state->engine = engine::Engine::Create(std::move(config));
      if (state->engine == nullptr) {
        // The epoll set or the doorbell eventfd could not be created.
        error = errno != 0 ? errno : ENOMEM;
        state.reset();
      }
    }
  } catch (...) {
    state.reset();
  }
  bool registered = false;
  if (state != nullptr) {
    // libibverbs closes async_fd in verbs_uninit_context.
    state->async_events->ReleaseReadFd();
    context->vctx.context.async_fd = state->async_events->read_fd();
    context->vctx.context.num_comp_vectors = DeviceLimits::kCompVectors;
    context->state = state.get();
    pabi::verbs_set_ops(&context->vctx, &kContextOps);
    try {
      std::lock_guard<std::mutex> lock(device->mutex);
      device->contexts.push_back(context);  // now port events reach it
      registered = true;
    } catch (...) {
      context->state = nullptr;
    }
  }
  if (!registered) {
    state.reset();
    pabi::verbs_uninit_context(&context->vctx);
    std::free(context);
    SIWX_LOG(kError, "cannot open %s: %s; free file descriptors or memory and retry",
             ibdev->name, std::strerror(error));
    errno = error;
    return nullptr;
  }
  state.release();  // owned by the context from now on, freed in FreeContext
  SIWX_LOG(kDebug, "opened %s", ibdev->name);
  return &context->vctx;
}

void FillDeviceAttr(const Device& device, ibv_device_attr_ex* attr_ex) {
  ibv_device_attr& a = attr_ex->orig_attr;
  std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", kFirmwareVersion);
  std::memcpy(&a.node_guid, device.node_guid.data(), sizeof(a.node_guid));
  std::memcpy(&a.sys_image_guid, device.system_image_guid.data(), sizeof(a.sys_image_guid));
  a.max_mr_size = UINT64_MAX;
  a.page_size_cap = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  a.vendor_id = kVendorId;
  a.vendor_part_id = kVendorPartId;
  a.hw_ver = 0;
  a.max_qp = DeviceLimits::kMaxQp;
  a.max_qp_wr = DeviceLimits::kMaxQpWr;
  // No MEM_MGT_EXTENSIONS: it promises fast-register MRs and memory windows,
  // which are not offered (Send with Invalidate and Local Invalidate are
  // served without it). Nothing we run looks at the flag: libfabric's verbs
  // provider, perftest, librdmacm and rping do not.
  a.device_cap_flags = IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a.max_sge = DeviceLimits::kMaxSge;
  a.max_sge_rd = DeviceLimits::kMaxSgeRead;
  a.max_cq = DeviceLimits::kMaxCq;
  a.max_cqe = DeviceLimits::kMaxCqe;
  a.max_mr = DeviceLimits::kMaxMr;
  a.max_pd = DeviceLimits::kMaxPd;
  a.max_qp_rd_atom = DeviceLimits::kMaxIrd;
  a.max_qp_init_rd_atom = DeviceLimits::kMaxOrd;
  a.max_res_rd_atom = DeviceLimits::kMaxQp * DeviceLimits::kMaxIrd;
  a.atomic_cap = IBV_ATOMIC_NONE;  // RFC 7306 atomics are not served
  a.max_srq = DeviceLimits::kMaxSrq;
  a.max_srq_wr = DeviceLimits::kMaxSrqWr;
  a.max_srq_sge = DeviceLimits::kMaxSrqSge;
  a.max_pkeys = DeviceLimits::kPkeyTableLength;
  a.phys_port_cnt = DeviceLimits::kPortCount;
  attr_ex->device_cap_flags_ex = a.device_cap_flags;
  attr_ex->phys_port_cnt_ex = DeviceLimits::kPortCount;
}

}  // namespace

bool IsSiwxDevice(const ibv_device* device) {
  if (device == nullptr) return false;
  return reinterpret_cast<const pabi::verbs_device*>(device)->ops == &kDeviceOps;
}

bool IsSiwxContext(const ibv_context* context) {
  return context != nullptr && IsSiwxDevice(context->device);
}

int QueryDeviceEx(ibv_context* context, const ibv_query_device_ex_input* input,
                  ibv_device_attr_ex* attr, std::size_t attr_size) noexcept {
  // The kernel's rules (ibv_cmd_query_device_any): no input options are
  // defined, and the caller's struct must hold at least ibv_device_attr.
  if (input != nullptr && input->comp_mask != 0) return EINVAL;
  if (attr == nullptr || attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  FillDeviceAttr(*ToSiwx(context)->state->device, &full);
  // A caller built against newer headers may pass more: zero the rest.
  std::memset(attr, 0, attr_size);
  std::memcpy(attr, &full, std::min(attr_size, sizeof(full)));
  return 0;
}

int QueryPort(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr) noexcept {
  if (port_num != kPortNum || attr == nullptr) return EINVAL;
  Device* device = ToSiwx(context)->state->device;
  siwx_port_desc port;
  {
    std::lock_guard<std::mutex> lock(device->mutex);
    port = device->port;
  }
  // libibverbs zeroed *attr (__lib_query_port); fill what an iWARP port has.
  attr->state = port.link_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->phys_state = port.link_up ? 5 /* LinkUp */ : 3 /* Disabled */;
  attr->max_mtu = static_cast<ibv_mtu>(IbMtuFromBytes(port.mtu));
  attr->active_mtu = attr->max_mtu;
  attr->gid_tbl_len = DeviceLimits::kGidTableLength;
  attr->pkey_tbl_len = DeviceLimits::kPkeyTableLength;
  attr->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
  // An untagged DDP message is at most 2^32 - 1 octets: its MO field has 32
  // bits (RFC 5041 4.3).
  attr->max_msg_sz = UINT32_MAX;
  // The link speed is not known without ethtool; report what the kernel
  // reports then (ib_get_eth_speed's 1 Gb/s default): 1X SDR.
  attr->active_width = 1;  // IBV_WIDTH_1X
  attr->active_speed = 1;  // IBV_SPEED_SDR
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

void FreeContext(ibv_context* ibctx) noexcept {
  Context* context = ToSiwx(ibctx);
  ContextState* state = context->state;
  // Forgotten in a child of fork() (provider.h): stopping the engine would
  // join threads that are the parent's.
  if (state != nullptr && Inherited(context)) return;
  if (state != nullptr) {
    Device* device = state->device;
    {
      std::lock_guard<std::mutex> lock(device->mutex);
      auto& list = device->contexts;
      list.erase(std::remove(list.begin(), list.end(), context), list.end());
    }
    // The event queue reads async_fd in Purge; drop it before libibverbs
    // closes that fd.
    delete state;
    context->state = nullptr;
  }
  pabi::verbs_uninit_context(&context->vctx);
  std::free(context);
}

bool TakeBudget(std::atomic<std::uint32_t>& count, std::uint32_t limit) {
  std::uint32_t current = count.load(std::memory_order_relaxed);
  do {
    if (current >= limit) return false;
  } while (!count.compare_exchange_weak(current, current + 1, std::memory_order_relaxed));
  return true;
}

}  // namespace siwx::provider

// ---------------------------------------------------------------------------
// The exported API (siwx_provider.h).

using siwx::provider::Context;
using siwx::provider::Device;
using siwx::provider::DeviceLimits;
using siwx::provider::IsSiwxContext;
using siwx::provider::IsSiwxDevice;
using siwx::provider::ToSiwx;

namespace {

bool ValidPortDesc(const siwx_port_desc* port) {
  if (port == nullptr) return false;
  const std::size_t len = strnlen(port->ifname, SIWX_IFNAME_SIZE);
  return len > 0 && len < SIWX_IFNAME_SIZE;
}

siwx::provider::MacAddress MacOf(const siwx_port_desc& port) {
  siwx::provider::MacAddress mac;
  std::memcpy(mac.data(), port.mac, mac.size());
  return mac;
}

void CopyString(char* dst, std::size_t size, const char* prefix, const char* name) {
  std::snprintf(dst, size, "%s%s", prefix, name);
}

}  // namespace

extern "C" {

ibv_device* siwx_create_device(const siwx_port_desc* port) {
  if (!ValidPortDesc(port)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* device = new (std::nothrow) Device();
  if (device == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  device->port = *port;
  ibv_device& ib = device->vdev.device;
  ib.node_type = IBV_NODE_RNIC;
  ib.transport_type = IBV_TRANSPORT_IWARP;
  CopyString(ib.name, sizeof(ib.name), "siwx_", port->ifname);
  // There is no uverbs character device and no sysfs entry; the names say
  // where a kernel siwx device would appear.
  CopyString(ib.dev_name, sizeof(ib.dev_name), "uverbs_siwx_", port->ifname);
  CopyString(ib.dev_path, sizeof(ib.dev_path), "/sys/class/infiniband_verbs/uverbs_siwx_",
             port->ifname);
  CopyString(ib.ibdev_path, sizeof(ib.ibdev_path), "/sys/class/infiniband/siwx_", port->ifname);
  device->vdev.ops = &siwx::provider::kDeviceOps;
  device->vdev.refcount.store(1);  // the caller's permanent reference
  device->vdev.sysfs = nullptr;
  // Optional access flags (IBV_ACCESS_RELAXED_ORDERING ...) reach reg_mr,
  // which ignores them, as a kernel with optional-access support does.
  device->vdev.core_support = IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS;
  const siwx::provider::MacAddress mac = MacOf(*port);
  device->node_guid = siwx::provider::NodeGuid(mac, ib.name);
  device->system_image_guid = siwx::provider::InterfaceId(mac, ib.name);
  SIWX_LOG(kInfo, "device %s on interface %s (index %u, mtu %u, link %s)", ib.name,
           port->ifname, port->ifindex, port->mtu, port->link_up ? "up" : "down");
  return &ib;
}

int siwx_update_device(ibv_device* ibdev, const siwx_port_desc* port) {
  if (!IsSiwxDevice(ibdev) || !ValidPortDesc(port)) return EINVAL;
  Device* device = ToSiwx(ibdev);
  std::vector<Context*> notify;
  bool now_up = false;
  {
    std::lock_guard<std::mutex> lock(device->mutex);
    const bool was_up = device->port.link_up != 0;
    now_up = port->link_up != 0;
    // The device keeps its name if the interface is renamed, as siw does.
    char ifname[SIWX_IFNAME_SIZE];
    std::memcpy(ifname, device->port.ifname, sizeof(ifname));
    device->port = *port;
    std::memcpy(device->port.ifname, ifname, sizeof(ifname));
    if (was_up != now_up) {
      try {
        notify = device->contexts;
      } catch (...) {
        SIWX_LOG(kError, "out of memory: port event of %s not delivered", ibdev->name);
      }
      // Posting under the device mutex keeps contexts from closing meanwhile.
      for (Context* context : notify) {
        siwx::provider::PostAsyncEvent(context, 1,
                                       now_up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
      }
    }
  }
  if (!notify.empty()) {
    SIWX_LOG(kInfo, "%s port 1 is now %s", ibdev->name, now_up ? "ACTIVE" : "DOWN");
  }
  return 0;
}

void siwx_device_hold(ibv_device* ibdev) {
  if (!IsSiwxDevice(ibdev)) return;
  ToSiwx(ibdev)->vdev.refcount.fetch_add(1);
}

int siwx_is_siwx_device(const ibv_device* device) { return IsSiwxDevice(device) ? 1 : 0; }

int siwx_is_siwx_context(const ibv_context* context) { return IsSiwxContext(context) ? 1 : 0; }

ibv_comp_channel* siwx_create_comp_channel(ibv_context* context) {
  if (!IsSiwxContext(context)) {
    errno = EINVAL;
    return nullptr;
  }
  return siwx::provider::CreateCompChannel(context);
}

int siwx_destroy_comp_channel(ibv_comp_channel* channel) {
  if (channel == nullptr || !IsSiwxContext(channel->context)) return EINVAL;
  return siwx::provider::DestroyCompChannel(channel);
}

int siwx_gid_table_len(ibv_context* context, uint32_t port_num) {
  if (!IsSiwxContext(context) || port_num != 1) return 0;
  return DeviceLimits::kGidTableLength;
}

int siwx_query_gid_entry(ibv_context* context, uint32_t port_num, uint32_t index,
                         ibv_gid_entry* entry) {
  if (!IsSiwxContext(context) || entry == nullptr) return EINVAL;
  if (port_num != 1 || index >= DeviceLimits::kGidTableLength) return EINVAL;
  Device* device = ToSiwx(context)->state->device;
  siwx_port_desc port;
  {
    std::lock_guard<std::mutex> lock(device->mutex);
    port = device->port;
  }
  // A GID naming this process's listener for the device, so that programs
  // that exchange GIDs can connect QPs out of band (oob.h); the interface
  // id when the interface has no IPv4 address.
  const std::optional<siwx::provider::GidBytes> oob_gid = siwx::provider::oob::LocalGid(device);
  const siwx::provider::GidBytes gid =
      oob_gid ? *oob_gid : siwx::provider::PortGid(MacOf(port), context->device->name);
  if (std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; })) return ENODATA;
  *entry = ibv_gid_entry{};
  std::memcpy(entry->gid.raw, gid.data(), gid.size());
  entry->gid_index = index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_IB;  // what the kernel reports for iWARP ports
  entry->ndev_ifindex = port.ifindex;
  return 0;
}

int siwx_query_pkey(ibv_context* context, uint32_t port_num, int index, __be16* pkey) {
  if (!IsSiwxContext(context) || pkey == nullptr) return EINVAL;
  if (port_num != 1 || index < 0 ||
      static_cast<std::uint32_t>(index) >= DeviceLimits::kPkeyTableLength) {
    return EINVAL;
  }
  *pkey = htobe16(DeviceLimits::kDefaultPkey);
  return 0;
}

__be64 siwx_device_guid(ibv_device* ibdev) {
  if (!IsSiwxDevice(ibdev)) return 0;
  __be64 guid;
  std::memcpy(&guid, ToSiwx(ibdev)->node_guid.data(), sizeof(guid));
  return guid;
}

}  // extern "C"
