// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "rdmacm-ext/cm_devices.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "common/util/log.h"

namespace siwx::cm {
namespace {

constexpr std::string_view kDevicePrefix = "siwx_";

// Distinct addresses remembered at once; more empties the list (a process
// rarely uses more than a handful of local addresses).
constexpr std::size_t kMaxKnownInterfaces = 64;

std::uint32_t ScopeOf(const net::SockAddr& addr) {
  if (addr.family() != AF_INET6) return 0;
  return reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_scope_id;
}

}  // namespace

DeviceRegistry& DeviceRegistry::Get() {
  // Never destroyed: contexts stay open until exit, as in stock librdmacm.
  static DeviceRegistry* registry = new DeviceRegistry;
  return *registry;
}

void DeviceRegistry::SyncLocked() {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return;  // no RDMA devices at all (ENOSYS without the shim)
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    if (name == nullptr) continue;
    const std::string_view n(name);
    if (n.substr(0, kDevicePrefix.size()) != kDevicePrefix) continue;
    const std::string ifname(n.substr(kDevicePrefix.size()));
    const bool known = std::any_of(devices_.begin(), devices_.end(),
                                   [&](const Device& d) { return d.ifname == ifname; });
    if (known) continue;
    Device d;
    d.ifname = ifname;
    d.context = ibv_open_device(list[i]);
    if (d.context == nullptr) {
      SIWX_LOG(kWarn, "CM: cannot open %s (errno %d); its addresses get no device", name, errno);
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(d.context, &attr) == 0) {
      d.limits.max_ird = static_cast<std::uint32_t>(std::max(attr.max_qp_rd_atom, 0));
      d.limits.max_ord = static_cast<std::uint32_t>(std::max(attr.max_qp_init_rd_atom, 0));
    }
    d.pd = ibv_alloc_pd(d.context);
    if (d.pd == nullptr) SIWX_LOG(kWarn, "CM: cannot allocate the shared PD of %s", name);
    devices_.push_back(d);
  }
  // Devices stay referenced by their open contexts; the list itself can go.
  ibv_free_device_list(list);
  // Address changes are watched from the first device on, and like the
  // contexts for the rest of the process: one more descriptor.
  if (!devices_.empty() && changes_.ChangedSinceLastCall()) interfaces_.clear();
}

std::optional<std::string> DeviceRegistry::InterfaceForLocked(const net::SockAddr& addr) {
  if (changes_.ChangedSinceLastCall()) interfaces_.clear();
  for (const KnownInterface& known : interfaces_) {
    if (net::SameAddress(known.addr, addr) && ScopeOf(known.addr) == ScopeOf(addr)) {
      return known.ifname;
    }
  }
  std::optional<std::string> ifname = net::InterfaceForAddress(addr);
  if (interfaces_.size() >= kMaxKnownInterfaces) interfaces_.clear();
  interfaces_.push_back({addr.Unmapped(), ifname});
  return ifname;
}

DeviceLookup DeviceRegistry::ForAddress(const net::SockAddr& addr) {
  DeviceLookup out;
  if (addr.IsWildcard()) return out;  // a wildcard bind has no device (stock: verbs NULL)
  std::lock_guard lock(mu_);
  if (!synced_ || devices_.empty()) {
    SyncLocked();
    synced_ = true;
  }
  // CM-only mode: no address has a device, and nothing needs looking up.
  if (devices_.empty()) return out;
  const std::optional<std::string> ifname = InterfaceForLocked(addr);
  for (int pass = 0; pass < 2 && ifname; ++pass) {
    for (const Device& d : devices_) {
      if (d.ifname == *ifname) {
        out.context = d.context;
        out.pd = d.pd;
        return out;
      }
    }
    // The interface may have gained its device since (the shim follows
    // address changes).
    if (pass == 0) SyncLocked();
  }
  if (!devices_.empty()) out.error = ENODEV;
  return out;
}

std::vector<ibv_context*> DeviceRegistry::Contexts() {
  std::lock_guard lock(mu_);
  SyncLocked();
  synced_ = true;
  std::vector<ibv_context*> out;
  for (const Device& d : devices_) out.push_back(d.context);
  return out;
}

DeviceLimits DeviceRegistry::LimitsOf(const ibv_context* context) {
  std::lock_guard lock(mu_);
  for (const Device& d : devices_) {
    if (d.context == context) return d.limits;
  }
  return {};
}

bool DeviceRegistry::Owns(const ibv_context* context) {
  std::lock_guard lock(mu_);
  return std::any_of(devices_.begin(), devices_.end(),
                     [&](const Device& d) { return d.context == context; });
}

}  // namespace siwx::cm
