// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The siwx devices the CM hands out: one shared ibv_context per device and
// one shared PD per device, the same objects in rdma_cm_id.verbs/.pd and in
// rdma_get_devices(), as stock librdmacm does (libfabric matches them by
// pointer).
//
// Devices come from ibv_get_device_list(), which the siwx shim supplies; a
// siwx device is named siwx_<ifname> and serves the addresses of that
// interface. An address maps to its interface by exact match (getifaddrs),
// 127/8 to the loopback interface. The answers are kept until the kernel
// announces a link or address change (shim::AddressChanges): getifaddrs dumps
// every link and address over netlink, and a wildcard listener asks once per
// connection. (Core::BindAddr does not look loopback
// addresses up: a loopback bind names no device, as in the kernel CM.)
//
// CM-only mode: when the process has no siwx device at all (no shim loaded,
// as in the CM tests), addresses map to no context and ids get verbs = NULL;
// connection setup still works. When siwx devices exist, an address no
// device serves is ENODEV (rdma_bind_addr fails, rdma_resolve_addr reports
// ADDR_ERROR), as stock librdmacm reports non-RDMA addresses.
//
// Contexts are opened once and never closed (the stock CM keeps its devices
// for the life of the process too). Thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernel-shim/netdev.h"
#include "rdmacm-ext/cm_socket.h"

namespace siwx::cm {

// Read depths used when an id has no device (CM-only mode): Linux siw's
// limits (SIW_MAX_IRD_QP / SIW_MAX_ORD_QP).
inline constexpr std::uint32_t kCmOnlyMaxReadDepth = 128;

struct DeviceLimits {
  std::uint32_t max_ird = kCmOnlyMaxReadDepth;  // max_qp_rd_atom: responder resources
  std::uint32_t max_ord = kCmOnlyMaxReadDepth;  // max_qp_init_rd_atom: initiator depth
};

struct DeviceLookup {
  ibv_context* context = nullptr;  // nullptr: CM-only mode or error
  ibv_pd* pd = nullptr;            // the device's shared PD (may be nullptr if it failed)
  int error = 0;                   // ENODEV: siwx devices exist, none serves the address
};

class DeviceRegistry {
 public:
  static DeviceRegistry& Get();

  DeviceLookup ForAddress(const net::SockAddr& addr);
  // All siwx contexts, opening any new devices first.
  std::vector<ibv_context*> Contexts();
  DeviceLimits LimitsOf(const ibv_context* context);
  bool Owns(const ibv_context* context);

 private:
  struct Device {
    std::string ifname;
    ibv_context* context = nullptr;
    ibv_pd* pd = nullptr;
    DeviceLimits limits;
  };
  struct KnownInterface {
    net::SockAddr addr;
    std::optional<std::string> ifname;  // nullopt: no interface has the address
  };
  void SyncLocked();
  std::optional<std::string> InterfaceForLocked(const net::SockAddr& addr);

  std::mutex mu_;
  std::vector<Device> devices_;  // guarded by mu_; never shrinks
  bool synced_ = false;          // guarded by mu_
  shim::AddressChanges changes_;            // guarded by mu_
  std::vector<KnownInterface> interfaces_;  // guarded by mu_; emptied on any change
};

}  // namespace siwx::cm
