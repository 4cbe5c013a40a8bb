// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The rdma_cm API (rdma/rdma_cma.h, librdmacm's RDMACM_1.0..1.3 version
// nodes) and the siwx_cm.h additions, as C entry points over cm::Core.
//
// Every entry point catches everything (Guarded()): no C++ exception
// crosses into C (an allocation failure becomes ENOMEM). Return convention
// as librdmacm: 0, or -1 with errno set; pointers or NULL with errno.
//
// Not supported over iWARP, and refused with the errno Linux gives on a
// kernel siw device: multicast (ENOSYS, as the kernel CM for iWARP), UD,
// IPoIB and IB port spaces and non-RC QP types (EOPNOTSUPP, as siw refuses
// such QPs), AF_IB (EAFNOSUPPORT), IB-only options (ENOSYS); ECE
// (EOPNOTSUPP). README.md has the audit of every symbol.
// The rsocket API is siwx's own (rsocket.cc, rsocket_api.cc), built on
// these calls.
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/util/log.h"
#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_devices.h"
#include "rdmacm-ext/siwx_cm.h"

namespace {

using siwx::cm::Core;
using siwx::cm::EnumValue;

int Fail(int error) {
  errno = error;
  return -1;
}

int Result(int error) { return error == 0 ? 0 : Fail(error); }

// Runs `body` (returning 0 or an errno value) and converts the outcome.
template <typename Body>
int Guarded(Body&& body) noexcept {
  try {
    return Result(body());
  } catch (const std::bad_alloc&) {
    return Fail(ENOMEM);
  } catch (...) {
    return Fail(EIO);
  }
}

int CopyAddr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(std::malloc(len));
  if (*dst == nullptr) return ENOMEM;
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}

// A QP type iWARP does not have: EOPNOTSUPP, as kernel siw answers.
int RefuseQpType(ibv_qp_type type) {
  SIWX_LOG(kError, "QP type %d refused: iWARP has only RC QPs (EOPNOTSUPP)",
           siwx::cm::EnumValue(type));
  return EOPNOTSUPP;
}

int RefuseMulticast(rdma_cm_id* id, const sockaddr* addr) {
  if (addr == nullptr || !Core::Get().KnownId(id)) return EINVAL;
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return EINVAL;
  SIWX_LOG(kError, "rdma_join_multicast refused: iWARP has no multicast (ENOSYS, as the "
                   "kernel CM answers on an iWARP device)");
  return ENOSYS;
}

int GaiToErrno(int gai) {
  switch (gai) {
    case EAI_NONAME:
    case EAI_NODATA: return ENOENT;
    case EAI_AGAIN: return EAGAIN;
    case EAI_MEMORY: return ENOMEM;
    case EAI_FAMILY: return EAFNOSUPPORT;
    case EAI_SERVICE:
    case EAI_SOCKTYPE:
    case EAI_BADFLAGS: return EINVAL;
    case EAI_SYSTEM: return errno != 0 ? errno : EIO;
    default: return EIO;
  }
}

}  // namespace

extern "C" {

// ---- Event channels and events ----

rdma_event_channel* rdma_create_event_channel(void) {
  rdma_event_channel* channel = nullptr;
  const int rc = Guarded([&] { return Core::Get().CreateChannel(&channel); });
  return rc == 0 ? channel : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  (void)Guarded([&] {
    Core::Get().DestroyChannel(channel);
    return 0;
  });
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  return Guarded([&] { return Core::Get().GetEvent(channel, event); });
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  return Guarded([&] { return Core::Get().AckEvent(event); });
}

const char* rdma_event_str(rdma_cm_event_type event) {
  switch (siwx::cm::EnumValue(event)) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}

// ---- Ids ----

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                   rdma_port_space ps) {
  // As librdmacm: the port space implies the QP type.
  const int value = EnumValue(ps);
  const ibv_qp_type qp_type =
      value == RDMA_PS_UDP || value == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
  return Guarded([&] { return Core::Get().CreateId(channel, id, context, ps, qp_type); });
}

int rdma_destroy_id(rdma_cm_id* id) {
  return Guarded([&] { return Core::Get().DestroyId(id); });
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  return Guarded([&] { return Core::Get().MigrateId(id, channel); });
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  return Guarded([&] { return Core::Get().BindAddr(id, addr); });
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                      int /*timeout_ms: resolution is immediate*/) {
  return Guarded([&] { return Core::Get().ResolveAddr(id, src_addr, dst_addr); });
}

int rdma_resolve_route(rdma_cm_id* id, int /*timeout_ms*/) {
  return Guarded([&] { return Core::Get().ResolveRoute(id); });
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  return Guarded([&] { return Core::Get().Listen(id, backlog); });
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  return Guarded([&] { return Core::Get().Connect(id, conn_param); });
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  return Guarded([&] { return Core::Get().Accept(id, conn_param); });
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return Guarded([&] { return Core::Get().Reject(id, private_data, private_data_len); });
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  // ECE is an InfiniBand CM extension; the reject itself is plain MPA.
  return rdma_reject(id, private_data, private_data_len);
}

int rdma_disconnect(rdma_cm_id* id) {
  return Guarded([&] { return Core::Get().Disconnect(id); });
}

int rdma_establish(rdma_cm_id* id) {
  return Guarded([&] { return Core::Get().Establish(id); });
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  return Guarded([&] { return Core::Get().GetRequest(listen, id); });
}

int rdma_notify(rdma_cm_id* id, ibv_event_type /*event*/) {
  return Guarded([&] { return Core::Get().Notify(id); });
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  return Guarded([&] { return Core::Get().SetOption(id, level, optname, optval, optlen); });
}

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return Guarded([&] { return Core::Get().InitQpAttr(id, qp_attr, qp_attr_mask); });
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
  if (id == nullptr) return 0;
  const sockaddr* a = &id->route.addr.src_addr;
  if (a->sa_family == AF_INET) return id->route.addr.src_sin.sin_port;
  if (a->sa_family == AF_INET6) return id->route.addr.src_sin6.sin6_port;
  return 0;
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
  if (id == nullptr) return 0;
  const sockaddr* a = &id->route.addr.dst_addr;
  if (a->sa_family == AF_INET) return id->route.addr.dst_sin.sin_port;
  if (a->sa_family == AF_INET6) return id->route.addr.dst_sin6.sin6_port;
  return 0;
}

// ---- QPs and SRQs ----

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* qp_init_attr) {
  return Guarded([&] { return Core::Get().CreateQpEx(id, qp_init_attr); });
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  return Guarded([&] {
    if (qp_init_attr == nullptr) return EINVAL;
    if (EnumValue(qp_init_attr->qp_type) != IBV_QPT_RC) return RefuseQpType(qp_init_attr->qp_type);
    ibv_qp_init_attr_ex attr{};
    std::memcpy(&attr, qp_init_attr, sizeof(*qp_init_attr));
    attr.comp_mask = IBV_QP_INIT_ATTR_PD;
    attr.pd = pd;
    const int rc = Core::Get().CreateQpEx(id, &attr);
    // As stock: the caller sees the CQs and the capabilities granted.
    if (rc == 0) std::memcpy(qp_init_attr, &attr, sizeof(*qp_init_attr));
    return rc;
  });
}

void rdma_destroy_qp(rdma_cm_id* id) {
  (void)Guarded([&] {
    Core::Get().DestroyQp(id);
    return 0;
  });
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  return Guarded([&] {
    if (id == nullptr || attr == nullptr || !Core::Get().KnownId(id)) return EINVAL;
    if (pd == nullptr) pd = id->pd;
    if (pd == nullptr) return EINVAL;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(pd, attr);
    if (srq == nullptr) return errno != 0 ? errno : ENOMEM;
    id->srq = srq;
    id->pd = pd;
    return 0;
  });
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  return Guarded([&] {
    if (id == nullptr || attr == nullptr || !Core::Get().KnownId(id)) return EINVAL;
    if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) != 0 && attr->srq_type != IBV_SRQT_BASIC) {
      return EOPNOTSUPP;  // XRC and tag matching SRQs are InfiniBand features
    }
    ibv_srq_init_attr basic{};
    basic.srq_context = attr->srq_context;
    basic.attr = attr->attr;
    ibv_pd* pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) != 0 ? attr->pd : nullptr;
    const int rc = rdma_create_srq(id, pd, &basic);
    if (rc != 0) return errno;
    attr->attr = basic.attr;
    return 0;
  });
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (id == nullptr || id->srq == nullptr) return;
  (void)ibv_destroy_srq(id->srq);
  id->srq = nullptr;
}

// ---- Endpoints ----

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                   ibv_qp_init_attr* qp_init_attr) {
  return Guarded([&] {
    if (id == nullptr || res == nullptr) return EINVAL;
    // As librdmacm: the id takes the port space and QP type of `res` (0
    // means what rdma_getaddrinfo would have said for TCP: RC), and so does
    // the QP, now (active side) or at rdma_get_request (passive side).
    const auto ps = static_cast<rdma_port_space>(res->ai_port_space != 0 ? res->ai_port_space
                                                                          : RDMA_PS_TCP);
    const auto qp_type =
        static_cast<ibv_qp_type>(res->ai_qp_type != 0 ? res->ai_qp_type : IBV_QPT_RC);
    Core& core = Core::Get();
    rdma_cm_id* cm_id = nullptr;
    int rc = core.CreateId(nullptr, &cm_id, nullptr, ps, qp_type);
    if (rc != 0) return rc;
    if ((res->ai_flags & RAI_PASSIVE) != 0) {
      rc = core.BindAddr(cm_id, res->ai_src_addr);
      if (rc == 0 && qp_init_attr != nullptr) {
        ibv_qp_init_attr deferred = *qp_init_attr;
        deferred.qp_type = qp_type;
        rc = core.SetEpQpInitAttr(cm_id, deferred, pd);
      }
      if (rc == 0 && qp_init_attr == nullptr && pd != nullptr) cm_id->pd = pd;
    } else {
      rc = core.ResolveAddr(cm_id, res->ai_src_addr, res->ai_dst_addr);
      if (rc == 0) rc = core.ResolveRoute(cm_id);
      if (rc == 0 && qp_init_attr != nullptr) {
        qp_init_attr->qp_type = qp_type;
        rc = rdma_create_qp(cm_id, pd, qp_init_attr) == 0 ? 0 : errno;
      }
    }
    if (rc != 0) {
      (void)core.DestroyId(cm_id);
      return rc;
    }
    *id = cm_id;
    return 0;
  });
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (id == nullptr) return;
  (void)Guarded([&] {
    Core& core = Core::Get();
    if (!core.KnownId(id)) return EINVAL;
    if (id->qp != nullptr) core.DestroyQp(id);
    if (id->srq != nullptr) rdma_destroy_srq(id);
    core.ClearEpQpInitAttr(id);
    return core.DestroyId(id);
  });
}

// ---- Addresses and devices ----

// As librdmacm's: a translation of getaddrinfo(3) with no device involved,
// for any port space (an id of a port space iWARP lacks is refused when it
// is created). A name that does not resolve returns getaddrinfo's EAI_*
// code, as librdmacm does (programs print it with gai_strerror), with errno
// set to the nearest errno value too; other failures are -1 with errno.
int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                     rdma_addrinfo** res) {
  int gai = 0;
  const int rc = Guarded([&] {
    if (res == nullptr || (node == nullptr && service == nullptr && hints == nullptr)) {
      return EINVAL;
    }
    const rdma_addrinfo no_hints{};
    const bool have_hints = hints != nullptr;
    if (!have_hints) hints = &no_hints;
    if (hints->ai_family != AF_UNSPEC && hints->ai_family != AF_INET &&
        hints->ai_family != AF_INET6) {
      return EAFNOSUPPORT;  // AF_IB needs an InfiniBand fabric
    }
    auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    if (rai == nullptr) return ENOMEM;
    const bool passive = (hints->ai_flags & RAI_PASSIVE) != 0;
    int err = 0;
    if (node != nullptr || service != nullptr) {
      addrinfo ai_hints{};
      ai_hints.ai_family = hints->ai_family;
      if (passive) ai_hints.ai_flags |= AI_PASSIVE;
      if ((hints->ai_flags & RAI_NUMERICHOST) != 0) ai_hints.ai_flags |= AI_NUMERICHOST;
      switch (hints->ai_qp_type) {
        case IBV_QPT_UD: ai_hints.ai_socktype = SOCK_DGRAM; break;
        case 0: break;
        default: ai_hints.ai_socktype = SOCK_STREAM; break;  // the connected QP types
      }
      switch (hints->ai_port_space) {
        case RDMA_PS_TCP: ai_hints.ai_protocol = IPPROTO_TCP; break;
        case RDMA_PS_UDP:
        case RDMA_PS_IPOIB: ai_hints.ai_protocol = IPPROTO_UDP; break;
        case RDMA_PS_IB:
          if (ai_hints.ai_socktype == SOCK_STREAM) ai_hints.ai_protocol = IPPROTO_TCP;
          if (ai_hints.ai_socktype == SOCK_DGRAM) ai_hints.ai_protocol = IPPROTO_UDP;
          break;
        default: break;
      }
      addrinfo* ai = nullptr;
      errno = 0;
      gai = getaddrinfo(node, service, have_hints ? &ai_hints : nullptr, &ai);
      if (gai != 0) {
        err = GaiToErrno(gai);
      } else {
        rai->ai_family = ai->ai_family;
        rai->ai_qp_type = hints->ai_qp_type != 0 ? hints->ai_qp_type
                          : ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD
                                                          : IBV_QPT_RC;
        rai->ai_port_space = hints->ai_port_space != 0 ? hints->ai_port_space
                             : ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP
                                                              : RDMA_PS_TCP;
        if (passive) {
          rai->ai_flags = RAI_PASSIVE;
          err = CopyAddr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
          if (err == 0 && ai->ai_canonname != nullptr) {
            rai->ai_src_canonname = strdup(ai->ai_canonname);
          }
        } else {
          err = CopyAddr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
          if (err == 0 && ai->ai_canonname != nullptr) {
            rai->ai_dst_canonname = strdup(ai->ai_canonname);
          }
        }
        freeaddrinfo(ai);
      }
    } else {
      rai->ai_flags = hints->ai_flags;
      rai->ai_family = hints->ai_family;
      rai->ai_qp_type = hints->ai_qp_type;
      rai->ai_port_space = hints->ai_port_space;
      if (hints->ai_dst_len != 0 && hints->ai_dst_addr != nullptr) {
        err = CopyAddr(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr,
                       hints->ai_dst_len);
      }
    }
    if (err == 0 && rai->ai_src_len == 0 && hints->ai_src_len != 0 &&
        hints->ai_src_addr != nullptr) {
      err = CopyAddr(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len);
    }
    if (err != 0) {
      rdma_freeaddrinfo(rai);
      return err;
    }
    *res = rai;
    return 0;
  });
  return rc != 0 && gai != 0 ? gai : rc;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res != nullptr) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_connect);
    std::free(res->ai_route);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res);
    res = next;
  }
}

ibv_context** rdma_get_devices(int* num_devices) {
  try {
    const std::vector<ibv_context*> contexts = siwx::cm::DeviceRegistry::Get().Contexts();
    auto** list =
        static_cast<ibv_context**>(std::calloc(contexts.size() + 1, sizeof(ibv_context*)));
    if (list == nullptr) {
      errno = ENOMEM;
      return nullptr;
    }
    for (std::size_t i = 0; i < contexts.size(); ++i) list[i] = contexts[i];
    if (num_devices != nullptr) *num_devices = static_cast<int>(contexts.size());
    return list;
  } catch (...) {
    errno = ENOMEM;
    return nullptr;
  }
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

// ---- Not over iWARP ----

// Multicast needs UD QPs: the kernel CM answers ENOSYS on an iWARP device
// once the id and address are valid (EINVAL before that), and librdmacm
// answers EADDRNOTAVAIL when leaving a group that was never joined.
int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* /*context*/) {
  return Guarded([&] { return RefuseMulticast(id, addr); });
}

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* /*context*/) {
  return Guarded([&] {
    if (attr == nullptr) return EINVAL;
    if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return EOPNOTSUPP;
    if ((attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) == 0) return EINVAL;
    if ((attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) == 0 ||
        attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED) {
      return EINVAL;
    }
    return RefuseMulticast(id, attr->addr);
  });
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  return Guarded([&] {
    if (addr == nullptr || !Core::Get().KnownId(id)) return EINVAL;
    if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return EINVAL;
    return EADDRNOTAVAIL;  // no group was ever joined
  });
}

int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return Fail(EOPNOTSUPP); }
int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return Fail(EOPNOTSUPP); }

// ---- siwx_cm.h ----

int siwx_cm_get_mpa_options(rdma_cm_id* id, siwx_cm_mpa_options* options) {
  return Guarded([&] { return Core::Get().GetMpaOptions(id, options); });
}

int siwx_cm_set_mpa_options(rdma_cm_id* id, const siwx_cm_mpa_options* options) {
  return Guarded([&] {
    if (options == nullptr) return EINVAL;
    return Core::Get().SetMpaOptions(id, *options);
  });
}

int siwx_cm_connection_info(rdma_cm_id* id, siwx_cm_conn_info* info) {
  return Guarded([&] { return Core::Get().ConnectionInfo(id, info); });
}

int siwx_cm_peer_private_data(rdma_cm_id* id, void* buf, size_t len) {
  std::size_t full = 0;
  const int rc = Guarded([&] { return Core::Get().PeerPrivateData(id, buf, len, &full); });
  return rc == 0 ? static_cast<int>(full) : -1;
}

}  // extern "C"
