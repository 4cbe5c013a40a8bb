// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Network interfaces that get a siwx device: every interface with at least
// one IPv4 or IPv6 address, found through libnl's route caches (links and
// addresses over NETLINK_ROUTE), with what the device needs to know of it:
// index, name, MTU, MAC, and whether it is operationally up.
//
// "Up" means the port is ACTIVE: the link is IFF_UP and IFF_RUNNING (carrier,
// or for loopback, whose operstate stays UNKNOWN, simply running) and its
// operstate is UP or UNKNOWN. Anything else (DOWN, DORMANT, LOWERLAYERDOWN,
// no carrier) is a DOWN port, as a kernel iWARP device reports it.
//
// StartNetdevMonitor listens for link and address changes (RTNLGRP_LINK and
// the IPv4/IPv6 address groups) on its own thread and calls back after each
// batch of notifications; the callback re-reads the interfaces.
// AddressChanges notices the same notifications without a thread, for the
// CM's cache of which interface has which address.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace siwx::shim {

struct Netdev {
  std::uint32_t ifindex = 0;
  std::string name;
  std::uint32_t mtu = 0;
  std::array<std::uint8_t, 6> mac{};  // zero without an Ethernet-style address
  bool up = false;                    // see the file comment
  std::vector<std::string> addresses; // "192.0.2.1/24", "2001:db8::1/64" (for `siwx devices`)
};

// The interfaces with an address, in ifindex order. std::nullopt (and a log
// line saying why) if netlink cannot be read.
std::optional<std::vector<Netdev>> DiscoverNetdevs();

// Whether a link with these properties counts as up (exposed for tests).
bool LinkIsUp(unsigned int ifflags, std::uint8_t operstate);

// Starts the listening thread; false (logged) if netlink is unavailable.
// `on_change` runs on that thread, which blocks every signal so it never
// runs the application's handlers. The thread runs until the process exits:
// a preloaded library has no safe point to stop it.
bool StartNetdevMonitor(std::function<void()> on_change);

// Tells whether the kernel announced a link or address change since the
// last call: a non-blocking rtnetlink socket subscribed to the groups above,
// drained on each call. The kernel queues a notification before the request
// that made the change returns, so a change made before a call is seen by
// it. In a forked child the socket is opened afresh (the inherited one is
// the parent's to read). Not thread-safe.
class AddressChanges {
 public:
  AddressChanges();
  ~AddressChanges();
  AddressChanges(const AddressChanges&) = delete;
  AddressChanges& operator=(const AddressChanges&) = delete;

  // True if anything changed, or if it cannot tell: the first call, no
  // netlink, notifications lost to a full socket buffer.
  bool ChangedSinceLastCall();

 private:
  struct Socket;
  std::unique_ptr<Socket> socket_;
  int owner_pid_ = 0;
};

}  // namespace siwx::shim
