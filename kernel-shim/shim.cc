// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// libsiwx-shim.so: the LD_PRELOAD library that stands in for the RDMA kernel
// side of device attach (see docs/architecture.md "Why a preload shim").
//
// Stock libibverbs finds devices through sysfs and netlink and answers GID,
// P_Key, GUID and completion-channel requests from the kernel. On a host
// without RDMA support all of those fail, so this library defines the few
// libibverbs entry points that reach the kernel and answers them for siwx
// devices through the provider's exported API (siwx_provider.h):
//
//   ibv_get_device_list      @@IBVERBS_1.1   real devices first, then one
//                                            siwx_<ifname> per interface with
//                                            an address (netdev.h)
//   ibv_create_comp_channel  @@IBVERBS_1.0   siwx event-queue channel
//   ibv_destroy_comp_channel @@IBVERBS_1.0   (libibverbs' one would leak the
//                                            channel's write end)
//   ibv_query_gid            @@IBVERBS_1.1
//   _ibv_query_gid_ex        @@IBVERBS_1.11  (inline ibv_query_gid_ex)
//   _ibv_query_gid_table     @@IBVERBS_1.11  (inline ibv_query_gid_table)
//   ibv_query_pkey           @@IBVERBS_1.1   (also reached by ibv_get_pkey_index)
//   ibv_get_device_guid      @@IBVERBS_1.1
//   ibv_query_gid_type       @@IBVERBS_PRIVATE_34 (ibv_devinfo prints a GID
//                                            only when it knows its type)
//
// The version nodes (shim.map) are those libibverbs exports, so applications'
// versioned references and libibverbs' own internal calls through its PLT
// bind here. Everything that is not a siwx object is forwarded to the next
// definition of the same name and version (dlvsym(RTLD_NEXT)), i.e. the real
// libibverbs. ibv_free_device_list needs no stand-in: the array returned
// here is calloc'ed and holds one reference per entry, exactly what the stock
// function releases.
//
// Devices are created once per interface and never freed (the registry keeps
// one reference). A monitor thread follows link and address changes: port
// states follow the link and the provider raises IBV_EVENT_PORT_ACTIVE /
// IBV_EVENT_PORT_ERR; interfaces that gain an address get a device; a
// device whose interface disappears (or loses its last address) leaves the
// list and its port goes DOWN.
//
// No entry point lets a C++ exception reach C code: the only allocating
// work (the device registry) runs inside try/catch. (The definitions cannot
// be noexcept: verbs.h declares them without.)
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <sys/types.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "kernel-shim/netdev.h"
#include "common/util/log.h"
#include "providers/siwx/siwx_provider.h"

// driver.h (not installed): the private libibverbs function we stand in for.
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                  int* type);

namespace siwx::shim {
namespace {

constexpr int kGidTypeSysfsIbRoceV1 = 0;  // enum ibv_gid_type_sysfs

// The real libibverbs definition of `name`@`version`, looked up once.
template <typename Fn>
Fn Real(const char* name, const char* version) {
  void* symbol = dlvsym(RTLD_NEXT, name, version);
  if (symbol == nullptr) {
    SIWX_LOG(kError, "libibverbs has no %s@%s; is libibverbs.so.1 from rdma-core v37..v56 "
                     "installed?", name, version);
  }
  return reinterpret_cast<Fn>(symbol);
}

#define SIWX_REAL(name, version)                                        \
  ([]() {                                                               \
    static const auto fn = ::siwx::shim::Real<decltype(&::name)>(#name, version); \
    return fn;                                                          \
  }())

siwx_port_desc ToPortDesc(const Netdev& dev) {
  siwx_port_desc port{};
  std::snprintf(port.ifname, sizeof(port.ifname), "%s", dev.name.c_str());
  port.ifindex = dev.ifindex;
  std::memcpy(port.mac, dev.mac.data(), sizeof(port.mac));
  port.mtu = dev.mtu;
  port.link_up = dev.up ? 1 : 0;
  return port;
}

// The siwx devices of this process, by interface index.
class DeviceRegistry {
 public:
  static DeviceRegistry& Get() {
    // Never destroyed: devices and the monitor thread live until exit.
    static DeviceRegistry* registry = new DeviceRegistry();
    return *registry;
  }

  // Re-reads the interfaces, creates devices for new ones and updates the
  // others; returns the devices of the interfaces present now. A device
  // whose interface went away (or lost its last address) stays, unlisted,
  // with its port DOWN. Keeps the last known set when netlink cannot be read.
  std::vector<ibv_device*> Refresh() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<std::vector<Netdev>> netdevs = DiscoverNetdevs();
    if (!netdevs.has_value()) return CurrentLocked();
    std::vector<ibv_device*> present;
    std::set<std::uint32_t> seen;
    for (const Netdev& dev : *netdevs) {
      if (dev.name.size() >= SIWX_IFNAME_SIZE) continue;
      const siwx_port_desc port = ToPortDesc(dev);
      auto it = devices_.find(dev.ifindex);
      if (it == devices_.end()) {
        ibv_device* device = siwx_create_device(&port);
        if (device == nullptr) {
          SIWX_LOG(kError, "cannot create device siwx_%s (%s); interface %s is left "
                   "without an RDMA device", dev.name.c_str(), std::strerror(errno),
                   dev.name.c_str());
          continue;
        }
        it = devices_.emplace(dev.ifindex, Entry{device, port, true}).first;
      } else {
        it->second.port = port;
        it->second.listed = true;
        siwx_update_device(it->second.device, &port);
      }
      seen.insert(dev.ifindex);
      present.push_back(it->second.device);
    }
    for (auto& [ifindex, entry] : devices_) {
      if (seen.count(ifindex) != 0 || !entry.listed) continue;
      entry.listed = false;
      entry.port.link_up = 0;
      siwx_update_device(entry.device, &entry.port);
    }
    if (present.empty()) {
      SIWX_LOG(kWarn, "no network interface has an IP address, so there is no siwx device; "
                      "configure an address (even 127.0.0.1 on lo) and retry");
    }
    StartMonitorLocked();
    return present;
  }

 private:
  DeviceRegistry() = default;

  struct Entry {
    ibv_device* device;
    siwx_port_desc port;  // as last given to the provider
    bool listed;          // the interface has an address: in the device list
  };

  std::vector<ibv_device*> CurrentLocked() const {
    std::vector<ibv_device*> all;
    for (const auto& [ifindex, entry] : devices_) {
      if (entry.listed) all.push_back(entry.device);
    }
    return all;
  }

  void StartMonitorLocked() {
    if (monitor_started_) return;
    monitor_started_ = true;
    StartNetdevMonitor([this] {
      try {
        Refresh();
      } catch (...) {
        SIWX_LOG(kWarn, "out of memory while following a network interface change");
      }
    });
  }

  std::mutex mutex_;
  std::map<std::uint32_t, Entry> devices_;        // guarded by mutex_; by ifindex
  bool monitor_started_ = false;                  // guarded by mutex_
};

}  // namespace
}  // namespace siwx::shim

using siwx::shim::DeviceRegistry;

extern "C" {

__attribute__((visibility("default"))) ibv_device** ibv_get_device_list(int* num_devices) {
  if (num_devices != nullptr) *num_devices = 0;
  auto real = SIWX_REAL(ibv_get_device_list, "IBVERBS_1.1");
  int real_count = 0;
  ibv_device** real_list = real != nullptr ? real(&real_count) : nullptr;
  const int real_errno = real_list == nullptr ? (real != nullptr ? errno : ENOSYS) : 0;
  if (real_list == nullptr) real_count = 0;

  std::vector<ibv_device*> ours;
  try {
    ours = DeviceRegistry::Get().Refresh();
  } catch (...) {
    SIWX_LOG(kError, "out of memory while listing siwx devices");
    ours.clear();
  }
  // Without a kernel the real call fails with ENOSYS; with siwx that is not
  // an error, only "no kernel devices".
  if (real_list == nullptr && real_errno != ENOSYS && ours.empty()) {
    errno = real_errno;
    return nullptr;
  }
  const std::size_t total = static_cast<std::size_t>(real_count) + ours.size();
  auto** list = static_cast<ibv_device**>(std::calloc(total + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    if (real_list != nullptr) {
      auto real_free = SIWX_REAL(ibv_free_device_list, "IBVERBS_1.1");
      if (real_free != nullptr) real_free(real_list);
    }
    errno = ENOMEM;
    return nullptr;
  }
  std::size_t n = 0;
  for (int i = 0; i < real_count; ++i) list[n++] = real_list[i];  // their references move
  for (ibv_device* device : ours) {
    siwx_device_hold(device);  // released by ibv_free_device_list
    list[n++] = device;
  }
  std::free(real_list);  // the array only; libibverbs calloc'ed it
  if (num_devices != nullptr) *num_devices = static_cast<int>(n);
  return list;
}

__attribute__((visibility("default"))) ibv_comp_channel* ibv_create_comp_channel(
    ibv_context* context) {
  if (siwx_is_siwx_context(context)) return siwx_create_comp_channel(context);
  auto real = SIWX_REAL(ibv_create_comp_channel, "IBVERBS_1.0");
  if (real == nullptr) {
    errno = ENOSYS;
    return nullptr;
  }
  return real(context);
}

__attribute__((visibility("default"))) int ibv_destroy_comp_channel(
    ibv_comp_channel* channel) {
  if (channel != nullptr && siwx_is_siwx_context(channel->context)) {
    return siwx_destroy_comp_channel(channel);
  }
  auto real = SIWX_REAL(ibv_destroy_comp_channel, "IBVERBS_1.0");
  return real != nullptr ? real(channel) : ENOSYS;
}

__attribute__((visibility("default"))) int ibv_query_gid(ibv_context* context, uint8_t port_num,
                                                         int index, ibv_gid* gid) {
  if (!siwx_is_siwx_context(context)) {
    auto real = SIWX_REAL(ibv_query_gid, "IBVERBS_1.1");
    if (real == nullptr) {
      errno = ENOSYS;
      return -1;
    }
    return real(context, port_num, index, gid);
  }
  ibv_gid_entry entry{};
  const int rc = index < 0 ? EINVAL
                           : siwx_query_gid_entry(context, port_num,
                                                  static_cast<uint32_t>(index), &entry);
  if (rc == ENODATA) {  // an empty entry reads as zeros (libibverbs does the same)
    std::memset(gid, 0, sizeof(*gid));
    return 0;
  }
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  *gid = entry.gid;
  return 0;
}

__attribute__((visibility("default"))) int _ibv_query_gid_ex(ibv_context* context,
                                                             uint32_t port_num,
                                                             uint32_t gid_index,
                                                             ibv_gid_entry* entry,
                                                             uint32_t flags,
                                                             size_t entry_size) {
  if (!siwx_is_siwx_context(context)) {
    auto real = SIWX_REAL(_ibv_query_gid_ex, "IBVERBS_1.11");
    return real != nullptr ? real(context, port_num, gid_index, entry, flags, entry_size)
                           : ENOSYS;
  }
  // No flags are defined; the entry must hold at least struct ibv_gid_entry.
  if (flags != 0 || entry == nullptr || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  ibv_gid_entry result{};
  const int rc = siwx_query_gid_entry(context, port_num, gid_index, &result);
  if (rc != 0) return rc;
  std::memset(entry, 0, entry_size);
  std::memcpy(entry, &result, sizeof(result));
  return 0;
}

__attribute__((visibility("default"))) ssize_t _ibv_query_gid_table(ibv_context* context,
                                                                    ibv_gid_entry* entries,
                                                                    size_t max_entries,
                                                                    uint32_t flags,
                                                                    size_t entry_size) {
  if (!siwx_is_siwx_context(context)) {
    auto real = SIWX_REAL(_ibv_query_gid_table, "IBVERBS_1.11");
    return real != nullptr ? real(context, entries, max_entries, flags, entry_size) : -ENOSYS;
  }
  if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  // One port; only valid (non-empty) entries are returned.
  size_t count = 0;
  const int table_len = siwx_gid_table_len(context, 1);
  for (int index = 0; index < table_len; ++index) {
    ibv_gid_entry result{};
    const int rc = siwx_query_gid_entry(context, 1, static_cast<uint32_t>(index), &result);
    if (rc == ENODATA) continue;
    if (rc != 0) return -rc;
    if (count == max_entries || entries == nullptr) return -EINVAL;  // caller's array too small
    auto* slot = reinterpret_cast<unsigned char*>(entries) + count * entry_size;
    std::memset(slot, 0, entry_size);
    std::memcpy(slot, &result, sizeof(result));
    ++count;
  }
  return static_cast<ssize_t>(count);
}

__attribute__((visibility("default"))) int ibv_query_pkey(ibv_context* context, uint8_t port_num,
                                                          int index, __be16* pkey) {
  if (!siwx_is_siwx_context(context)) {
    auto real = SIWX_REAL(ibv_query_pkey, "IBVERBS_1.1");
    if (real == nullptr) {
      errno = ENOSYS;
      return -1;
    }
    return real(context, port_num, index, pkey);
  }
  const int rc = siwx_query_pkey(context, port_num, index, pkey);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return 0;
}

__attribute__((visibility("default"))) __be64 ibv_get_device_guid(ibv_device* device) {
  if (siwx_is_siwx_device(device)) return siwx_device_guid(device);
  auto real = SIWX_REAL(ibv_get_device_guid, "IBVERBS_1.1");
  return real != nullptr ? real(device) : 0;
}

__attribute__((visibility("default"))) int ibv_query_gid_type(ibv_context* context,
                                                              uint8_t port_num,
                                                              unsigned int index,
                                                              int* type) {
  if (!siwx_is_siwx_context(context)) {
    auto real = SIWX_REAL(ibv_query_gid_type, "IBVERBS_PRIVATE_34");
    return real != nullptr ? real(context, port_num, index, type) : -1;
  }
  ibv_gid_entry entry{};
  const int rc = siwx_query_gid_entry(context, port_num, index, &entry);
  if (rc != 0 && rc != ENODATA) return -1;
  // iWARP ports report IBV_GID_TYPE_IB, which the sysfs view calls "IB/RoCE v1".
  *type = siwx::shim::kGidTypeSysfsIbRoceV1;
  return 0;
}

}  // extern "C"
