// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, addressing: rdma_bind_addr, rdma_resolve_addr,
// rdma_resolve_route and rdma_listen.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/cm_devices.h"

namespace siwx::cm {
namespace {

// Listen backlog when the application passes 0 or less.
constexpr int kDefaultBacklog = 1024;
// The least TCP listen queue (see Listen).
constexpr int kMinKernelBacklog = 128;

}  // namespace

// ---- Addressing ----

int Core::BindAddr(rdma_cm_id* pub, const sockaddr* addr) {
  const std::optional<net::SockAddr> a = net::SockAddr::From(addr);
  if (!a) return addr == nullptr ? EINVAL : EAFNOSUPPORT;
  // The device lookup may enumerate devices: do it before taking mu_.
  // A loopback address binds no device, like the wildcard: the kernel CM
  // treats both as "any address" here and picks a device only when a
  // connection resolves or arrives. libfabric's verbs provider relies on
  // this (it binds "localhost" and, finding no device, offers the addresses
  // of its non-loopback interfaces instead).
  const DeviceLookup d =
      a->IsLoopback() ? DeviceLookup{} : DeviceRegistry::Get().ForAddress(*a);
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || id->state != IdState::kIdle) return EINVAL;
  if (d.error != 0) return d.error;
  // The rdma_cm port space, not TCP's, decides what conflicts (as in the
  // kernel CM): a port is taken by ids bound to it, not by connections a
  // gone listener accepted on it. So the TCP socket of an explicit port
  // gets SO_REUSEADDR (Linux siw sets it on its sockets too), and conflicts
  // among our own ids are checked here.
  if (a->port() != 0) {
    const net::SockAddr mine = a->Unmapped();
    for (const auto& [key, other] : ids_) {
      if (!other->app_bound || other->fd < 0 || other == id) continue;
      const std::optional<net::SockAddr> theirs =
          net::SockAddr::From(&other->pub.route.addr.src_addr);
      if (!theirs || theirs->port() != a->port()) continue;
      if (id->reuseaddr && other->reuseaddr) continue;
      const net::SockAddr t = theirs->Unmapped();
      const bool same_address =
          t.family() == mine.family() && t.len == mine.len &&
          (t.family() == AF_INET
               ? reinterpret_cast<const sockaddr_in*>(&t.storage)->sin_addr.s_addr ==
                     reinterpret_cast<const sockaddr_in*>(&mine.storage)->sin_addr.s_addr
               : std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&t.storage)->sin6_addr,
                             &reinterpret_cast<const sockaddr_in6*>(&mine.storage)->sin6_addr,
                             sizeof(in6_addr)) == 0);
      if (same_address || t.IsWildcard() || mine.IsWildcard()) return EADDRINUSE;
    }
  }
  int fd = -1;
  int rc = net::OpenTcpSocket(a->family(), &fd);
  if (rc != 0) return rc;
  if (id->reuseaddr || a->port() != 0) (void)net::SetReuseAddr(fd, true);
  if (a->family() == AF_INET6 && id->afonly) (void)net::SetV6Only(fd, *id->afonly);
  rc = net::BindTo(fd, *a);
  net::SockAddr local;
  if (rc == 0) rc = net::LocalAddress(fd, &local);
  if (rc != 0) {
    net::Close(fd);
    return rc;
  }
  id->fd = fd;
  std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  id->pub.verbs = d.context;
  id->pub.pd = d.pd;
  id->pub.port_num = d.context != nullptr ? 1 : 0;
  id->state = IdState::kBound;
  id->app_bound = true;
  return 0;
}

int Core::ResolveAddr(rdma_cm_id* pub, const sockaddr* src, const sockaddr* dst) {
  const std::optional<net::SockAddr> d = net::SockAddr::From(dst);
  if (!d) return dst == nullptr ? EINVAL : EAFNOSUPPORT;
  bool bound;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    bound = id->state == IdState::kBound;
  }
  if (!bound && src != nullptr) {
    const int rc = BindAddr(pub, src);
    if (rc != 0) return rc;
    bound = true;
  }
  // The source address the kernel will use, and the device that owns it.
  net::SockAddr source;
  int route_error = net::SourceAddressFor(*d, &source);
  DeviceLookup device;
  if (route_error == 0) {
    device = DeviceRegistry::Get().ForAddress(source);
  }
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    sync = id->sync;
    if (bound && id->pub.route.addr.src_addr.sa_family != d->family()) return EINVAL;
    std::memcpy(&id->pub.route.addr.dst_storage, &d->storage, sizeof(d->storage));
    int error = route_error;
    if (error == 0 && !bound) {
      // Bind now (port 0): the id gets its local port at once, as the
      // kernel CM does, and the connect leaves from this address.
      int fd = -1;
      error = net::OpenTcpSocket(d->family(), &fd);
      if (error == 0) {
        if (id->reuseaddr) (void)net::SetReuseAddr(fd, true);
        net::SockAddr local;
        error = net::BindTo(fd, source);
        if (error == 0) error = net::LocalAddress(fd, &local);
        if (error == 0) {
          id->fd = fd;
          std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
        } else {
          net::Close(fd);
        }
      }
    }
    if (error == 0 && id->pub.verbs == nullptr) {
      error = device.error;
      id->pub.verbs = device.context;
      id->pub.pd = device.pd;
      id->pub.port_num = device.context != nullptr ? 1 : 0;
    }
    if (error != 0) {
      id->failure = std::string("address resolution failed: ") + std::strerror(error);
      Post(id, RDMA_CM_EVENT_ADDR_ERROR, -error);
    } else {
      id->state = IdState::kAddrResolved;
      Post(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    }
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::ResolveRoute(rdma_cm_id* pub) {
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->state != IdState::kAddrResolved) return EINVAL;
    // iWARP routes are TCP routes: nothing to resolve beyond the address.
    id->state = IdState::kRouteResolved;
    sync = id->sync;
    Post(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::Listen(rdma_cm_id* pub, int backlog) {
  bool idle;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    idle = id->state == IdState::kIdle;
  }
  if (idle) {
    // As the kernel CM: an unbound id listens on the IPv4 wildcard.
    const net::SockAddr any = net::SockAddr::Wildcard(AF_INET);
    const int rc = BindAddr(pub, any.get());
    if (rc != 0) return rc;
  }
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || id->state != IdState::kBound) return EINVAL;
  id->listen.backlog = backlog > 0 ? backlog : kDefaultBacklog;
  // Accepted connections inherit SO_REUSEADDR: they must not keep the port
  // from the next listener (see BindAddr).
  (void)net::SetReuseAddr(id->fd, true);
  // The kernel queue holds connections for the CM thread, which takes them
  // at once (half-open ones take no backlog slot): a small application
  // backlog must not make a burst of SYNs wait for retransmission.
  const int rc = net::ListenOn(id->fd, std::max(id->listen.backlog, kMinKernelBacklog));
  if (rc != 0) return rc;
  net::SockAddr local;
  if (net::LocalAddress(id->fd, &local) == 0) {
    std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  }
  id->state = IdState::kListening;
  UpdateInterest(id);
  Wake();
  return 0;
}

}  // namespace siwx::cm
