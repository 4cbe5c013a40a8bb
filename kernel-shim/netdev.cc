// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "kernel-shim/netdev.h"

#include <arpa/inet.h>
#include <linux/if.h>
#include <linux/rtnetlink.h>
#include <netlink/addr.h>
#include <netlink/cache.h>
#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/socket.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "common/util/log.h"
#include "common/util/service_thread.h"

namespace siwx::shim {
namespace {

struct SocketDeleter {
  void operator()(nl_sock* sock) const { nl_socket_free(sock); }
};
struct CacheDeleter {
  void operator()(nl_cache* cache) const { nl_cache_free(cache); }
};
using SocketPtr = std::unique_ptr<nl_sock, SocketDeleter>;
using CachePtr = std::unique_ptr<nl_cache, CacheDeleter>;

constexpr unsigned int kArpEther = 1;  // ARPHRD_ETHER

}  // namespace

bool LinkIsUp(unsigned int ifflags, std::uint8_t operstate) {
  const bool running = (ifflags & IFF_UP) != 0 && (ifflags & IFF_RUNNING) != 0;
  return running && (operstate == IF_OPER_UP || operstate == IF_OPER_UNKNOWN);
}

std::optional<std::vector<Netdev>> DiscoverNetdevs() {
  SocketPtr sock(nl_socket_alloc());
  if (!sock) {
    SIWX_LOG(kError, "cannot list network interfaces: out of memory");
    return std::nullopt;
  }
  if (int err = nl_connect(sock.get(), NETLINK_ROUTE); err < 0) {
    SIWX_LOG(kError,
             "cannot list network interfaces: rtnetlink socket: %s; "
             "siwx needs NETLINK_ROUTE (is this a restricted sandbox?)",
             nl_geterror(err));
    return std::nullopt;
  }
  nl_cache* raw_links = nullptr;
  if (int err = rtnl_link_alloc_cache(sock.get(), AF_UNSPEC, &raw_links); err < 0) {
    SIWX_LOG(kError, "cannot list network interfaces: %s", nl_geterror(err));
    return std::nullopt;
  }
  CachePtr links(raw_links);
  nl_cache* raw_addrs = nullptr;
  if (int err = rtnl_addr_alloc_cache(sock.get(), &raw_addrs); err < 0) {
    SIWX_LOG(kError, "cannot list interface addresses: %s", nl_geterror(err));
    return std::nullopt;
  }
  CachePtr addrs(raw_addrs);

  std::set<int> with_address;
  std::map<int, std::vector<std::string>> address_text;
  for (nl_object* obj = nl_cache_get_first(addrs.get()); obj != nullptr;
       obj = nl_cache_get_next(obj)) {
    auto* addr = reinterpret_cast<rtnl_addr*>(obj);
    const int family = rtnl_addr_get_family(addr);
    if (family != AF_INET && family != AF_INET6) continue;
    with_address.insert(rtnl_addr_get_ifindex(addr));
    char text[INET6_ADDRSTRLEN + 8];
    if (nl_addr* local = rtnl_addr_get_local(addr); local != nullptr) {
      address_text[rtnl_addr_get_ifindex(addr)].push_back(nl_addr2str(local, text, sizeof(text)));
    }
  }

  std::vector<Netdev> result;
  for (nl_object* obj = nl_cache_get_first(links.get()); obj != nullptr;
       obj = nl_cache_get_next(obj)) {
    auto* link = reinterpret_cast<rtnl_link*>(obj);
    const int ifindex = rtnl_link_get_ifindex(link);
    if (ifindex <= 0 || with_address.count(ifindex) == 0) continue;
    const char* name = rtnl_link_get_name(link);
    if (name == nullptr || name[0] == '\0') continue;
    Netdev dev;
    dev.ifindex = static_cast<std::uint32_t>(ifindex);
    dev.name = name;
    dev.mtu = rtnl_link_get_mtu(link);
    const unsigned int flags = rtnl_link_get_flags(link);
    dev.up = LinkIsUp(flags, rtnl_link_get_operstate(link));
    nl_addr* lladdr = rtnl_link_get_addr(link);
    if (lladdr != nullptr && rtnl_link_get_arptype(link) == kArpEther &&
        nl_addr_get_len(lladdr) == dev.mac.size()) {
      std::memcpy(dev.mac.data(), nl_addr_get_binary_addr(lladdr), dev.mac.size());
    }
    if (auto it = address_text.find(ifindex); it != address_text.end()) {
      dev.addresses = it->second;
    }
    result.push_back(std::move(dev));
  }
  std::sort(result.begin(), result.end(),
            [](const Netdev& a, const Netdev& b) { return a.ifindex < b.ifindex; });
  return result;
}

namespace {

int CountMessage(nl_msg* /*msg*/, void* arg) {
  *static_cast<int*>(arg) += 1;
  return NL_OK;
}

void MonitorLoop(nl_sock* raw_sock, std::function<void()> on_change) {
  SocketPtr sock(raw_sock);
  int messages = 0;
  nl_socket_modify_cb(sock.get(), NL_CB_VALID, NL_CB_CUSTOM, CountMessage, &messages);
  for (;;) {
    messages = 0;
    const int err = nl_recvmsgs_default(sock.get());
    if (err < 0 && err != -NLE_INTR && err != -NLE_AGAIN && err != -NLE_NOMEM) {
      SIWX_LOG(kWarn, "network interface monitor stopped: %s; port states will no "
                      "longer follow link changes", nl_geterror(err));
      return;
    }
    // -NLE_NOMEM: the kernel dropped notifications (ENOBUFS); re-read anyway.
    if (messages > 0 || err == -NLE_NOMEM) on_change();
  }
}

}  // namespace

bool StartNetdevMonitor(std::function<void()> on_change) {
  SocketPtr sock(nl_socket_alloc());
  if (!sock) return false;
  nl_socket_disable_seq_check(sock.get());
  if (int err = nl_connect(sock.get(), NETLINK_ROUTE); err < 0) {
    SIWX_LOG(kWarn, "cannot watch network interfaces: %s; port states will not "
                    "follow link changes", nl_geterror(err));
    return false;
  }
  if (int err = nl_socket_add_memberships(sock.get(), RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR,
                                          RTNLGRP_IPV6_IFADDR, 0);
      err < 0) {
    SIWX_LOG(kWarn, "cannot watch network interfaces: %s; port states will not "
                    "follow link changes", nl_geterror(err));
    return false;
  }
  bool started = true;
  try {
    util::StartServiceThread("siwx-netdev", MonitorLoop, sock.get(), std::move(on_change)).detach();
  } catch (...) {
    started = false;
  }
  if (!started) {
    SIWX_LOG(kWarn, "cannot start the network interface monitor thread; port states "
                    "will not follow link changes");
    return false;
  }
  sock.release();  // owned by the thread
  return true;
}

struct AddressChanges::Socket {
  SocketPtr sock;
};

AddressChanges::AddressChanges() = default;
AddressChanges::~AddressChanges() = default;

bool AddressChanges::ChangedSinceLastCall() {
  const int pid = static_cast<int>(::getpid());
  if (socket_ == nullptr || owner_pid_ != pid) {
    // A socket inherited over fork is the parent's to read: close this copy.
    socket_.reset();
    owner_pid_ = pid;
    auto s = std::make_unique<Socket>();
    s->sock.reset(nl_socket_alloc());
    if (!s->sock) return true;
    nl_socket_disable_seq_check(s->sock.get());
    if (nl_connect(s->sock.get(), NETLINK_ROUTE) < 0 ||
        nl_socket_add_memberships(s->sock.get(), RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR,
                                  RTNLGRP_IPV6_IFADDR, 0) < 0 ||
        nl_socket_set_nonblocking(s->sock.get()) < 0) {
      SIWX_LOG(kDebug, "cannot watch address changes over netlink; each address lookup "
                       "reads the interfaces");
      return true;
    }
    socket_ = std::move(s);
    return true;  // nothing was known before the subscription
  }
  // The messages themselves do not matter, only that some came: read them
  // raw into one buffer (nl_recv would allocate one per call, and this runs
  // once per address lookup).
  bool changed = false;
  std::array<std::uint8_t, 8192> buf;
  for (;;) {
    const ssize_t n = ::recv(nl_socket_get_fd(socket_->sock.get()), buf.data(), buf.size(),
                             MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return changed;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;  // ENOBUFS: notifications were lost; or a broken socket
    changed = true;
  }
}

}  // namespace siwx::shim
