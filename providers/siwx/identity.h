// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// How a siwx device identifies itself, derived from its network interface.
//  - Node GUID as the kernel siw driver makes it: the interface's MAC in
//    octets 0..5, octets 6..7 zero; an interface without a MAC (loopback)
//    uses the first six characters of the device name instead, because
//    connection managers expect a non-zero GUID.
//  - Interface id: the MAC as a modified EUI-64 (RFC 4291 appendix A: ff:fe
//    in the middle, universal/local bit inverted), or the node GUID when
//    there is no MAC. It is the system image GUID.
//  - GID table: one entry, subnet prefix zero and the interface id in octets
//    8..15. Kernel iWARP drivers put the MAC in octets 0..5 instead, but
//    tools ignore such a GID (ibv_devinfo prints a GID only when octets 8..15
//    are not all zero), and iWARP addresses peers by IP, never by GID. A
//    zero subnet prefix keeps libfabric from deriving an InfiniBand (AF_IB)
//    address from the GID, which it does only when both halves are non-zero.
//  - MTU: the interface MTU rounded down to an IB MTU enum value, 256 at least.
//
// All octet arrays are in network order, as the __be64/ibv_gid fields that
// receive them. Pure functions; no rdma-core types.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace siwx::provider {

using MacAddress = std::array<std::uint8_t, 6>;
using Guid = std::array<std::uint8_t, 8>;
using GidBytes = std::array<std::uint8_t, 16>;

inline bool IsZero(const MacAddress& mac) {
  return std::all_of(mac.begin(), mac.end(), [](std::uint8_t b) { return b == 0; });
}

inline Guid NodeGuid(const MacAddress& mac, std::string_view device_name) {
  Guid guid{};
  if (!IsZero(mac)) {
    std::copy(mac.begin(), mac.end(), guid.begin());
  } else {
    const std::size_t n = std::min<std::size_t>(device_name.size(), 6);
    std::copy_n(device_name.begin(), n, guid.begin());
  }
  return guid;
}

inline Guid InterfaceId(const MacAddress& mac, std::string_view device_name) {
  if (IsZero(mac)) return NodeGuid(mac, device_name);
  return {static_cast<std::uint8_t>(mac[0] ^ 0x02), mac[1], mac[2], 0xFF, 0xFE,
          mac[3], mac[4], mac[5]};
}

inline GidBytes PortGid(const MacAddress& mac, std::string_view device_name) {
  GidBytes gid{};
  const Guid id = InterfaceId(mac, device_name);
  std::copy(id.begin(), id.end(), gid.begin() + 8);
  return gid;
}

// Out-of-band connect (docs/out-of-band-connect.md): the GID of a port with
// an IPv4 address names a TCP endpoint of this process: octets 0..7 zero,
// 8..9 the listener's port, 10..11 ff ff, 12..15 the address. Port and
// address are in network order, as they appear in the GID.
struct OobEndpoint {
  std::uint32_t address = 0;
  std::uint16_t port = 0;
};

inline GidBytes OobGid(const OobEndpoint& endpoint) {
  GidBytes gid{};
  std::memcpy(gid.data() + 8, &endpoint.port, 2);
  gid[10] = 0xFF;
  gid[11] = 0xFF;
  std::memcpy(gid.data() + 12, &endpoint.address, 4);
  return gid;
}

// The endpoint a GID names; false for any other GID (a zero port or
// address, a non-zero subnet prefix, no ff ff).
inline bool OobEndpointOf(const GidBytes& gid, OobEndpoint* out) {
  if (!std::all_of(gid.begin(), gid.begin() + 8, [](std::uint8_t b) { return b == 0; })) {
    return false;
  }
  if (gid[10] != 0xFF || gid[11] != 0xFF) return false;
  OobEndpoint e;
  std::memcpy(&e.port, gid.data() + 8, 2);
  std::memcpy(&e.address, gid.data() + 12, 4);
  if (e.port == 0 || e.address == 0) return false;
  *out = e;
  return true;
}

// enum ibv_mtu values: IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5.
inline std::uint32_t IbMtuFromBytes(std::uint32_t mtu) {
  if (mtu >= 4096) return 5;
  if (mtu >= 2048) return 4;
  if (mtu >= 1024) return 3;
  if (mtu >= 512) return 2;
  return 1;
}

}  // namespace siwx::provider
