// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The rsocket API (rdma/rsocket.h) as C entry points over rsocket.cc,
// exported from librdmacm-siwx.so with librdmacm's RDMACM_1.0 version node
// so that stock rstream/riostream/rcopy and librspreload bind to them.
//
// Return convention as stock rsockets: -1 with errno set on failure. No C++
// exception crosses into C (an allocation failure becomes ENOMEM).
//
// Not supported, with a clear errno:
//  - SOCK_DGRAM: datagram rsockets need UD QPs, which iWARP does not have
//    (kernel siw creates RC QPs only and refuses others with EOPNOTSUPP):
//    rsocket() fails with EOPNOTSUPP. librspreload then falls back to a
//    kernel UDP socket, as for any socket rsocket() refuses.
//  - AF_IB: no InfiniBand addressing over iWARP (EAFNOSUPPORT).
//  - Keepalive messages: SO_KEEPALIVE and TCP_KEEPIDLE are accepted and
//    reported back, but no keepalive is sent (the stream below is TCP).
//  - RDMA_ROUTE (an InfiniBand path record): accepted and ignored.
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "common/util/log.h"
#include "rdmacm-ext/rsocket.h"

namespace {

using siwx::rs::Socket;
using SocketPtr = std::shared_ptr<Socket>;

int Fail(int error) {
  errno = error;
  return -1;
}

template <typename Body>
auto Guarded(Body&& body) noexcept -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (...) {
    errno = EIO;
  }
  return -1;
}

ssize_t CountOrFail(ssize_t r) {
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}

void CopyAddr(sockaddr* dst, socklen_t* len, const sockaddr* src) {
  if (dst == nullptr || len == nullptr || src == nullptr) return;
  const socklen_t size = src->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(dst, src, std::min(*len, size));
  *len = size;
}

bool IntArg(const void* optval, socklen_t optlen, int* out) {
  if (optval == nullptr || optlen < static_cast<socklen_t>(sizeof(int))) return false;
  std::memcpy(out, optval, sizeof(int));
  return true;
}

void SetBit(std::uint64_t* opts, int optname, bool on) {
  if (optname < 0 || optname >= 64) return;
  if (on) {
    *opts |= std::uint64_t{1} << optname;
  } else {
    *opts &= ~(std::uint64_t{1} << optname);
  }
}

bool GetBit(std::uint64_t opts, int optname) {
  return optname >= 0 && optname < 64 && (opts & (std::uint64_t{1} << optname)) != 0;
}

bool PutInt(void* optval, socklen_t* optlen, int v) {
  if (optval == nullptr || optlen == nullptr || *optlen < static_cast<socklen_t>(sizeof(int))) {
    return false;
  }
  std::memcpy(optval, &v, sizeof(v));
  *optlen = sizeof(int);
  return true;
}

int SetOption(Socket& s, int level, int optname, const void* optval, socklen_t optlen) {
  int v = 0;
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
          if (!IntArg(optval, optlen, &v)) return EINVAL;
          (void)rdma_set_option(s.id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof(v));
          SetBit(&s.so_opts, optname, v != 0);
          return 0;
        case SO_RCVBUF:
          if (!IntArg(optval, optlen, &v) || v < 0) return EINVAL;
          if (s.rbuf == nullptr) s.rbuf_size = static_cast<std::uint32_t>(v) << 1;
          return 0;
        case SO_SNDBUF:
          if (!IntArg(optval, optlen, &v) || v < 0) return EINVAL;
          if (s.sbuf == nullptr) s.sbuf_size = std::max(static_cast<std::uint32_t>(v) << 1, 4096u);
          return 0;
        case SO_LINGER: {
          if (optval == nullptr || optlen < static_cast<socklen_t>(sizeof(linger))) return EINVAL;
          linger l;
          std::memcpy(&l, optval, sizeof(l));
          SetBit(&s.so_opts, optname, l.l_onoff != 0);
          return 0;
        }
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          if (!IntArg(optval, optlen, &v)) return EINVAL;
          SetBit(&s.so_opts, optname, v != 0);
          return 0;
        default:
          return ENOTSUP;
      }
    case IPPROTO_IP:
      if (optname != IP_TOS) return ENOTSUP;
      if (!IntArg(optval, optlen, &v)) return EINVAL;
      s.ip_tos = v;
      return 0;
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          if (!IntArg(optval, optlen, &v)) return EINVAL;
          SetBit(&s.tcp_opts, optname, v != 0);
          return 0;
        case TCP_KEEPIDLE:
          if (!IntArg(optval, optlen, &v)) return EINVAL;
          if (v <= 0) return EINVAL;
          s.keepalive_time = v;
          return 0;
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
        case TCP_MAXSEG:
        case TCP_CONGESTION:
          return 0;  // as stock: not applicable to a reliable connection
        default:
          return ENOTSUP;
      }
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return ENOTSUP;
      if (!IntArg(optval, optlen, &v)) return EINVAL;
      if (rdma_set_option(s.id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &v, sizeof(v)) != 0 &&
          errno != ENOSYS) {
        return errno;
      }
      SetBit(&s.ipv6_opts, optname, v != 0);
      return 0;
    case SOL_RDMA:
      // Queue and buffer sizes are fixed once the connection is set up.
      if (s.phase != siwx::rs::Phase::kInit && s.phase != siwx::rs::Phase::kListening) {
        return EINVAL;
      }
      if (optname == RDMA_ROUTE) return 0;  // InfiniBand path record: nothing to do on iWARP
      if (!IntArg(optval, optlen, &v) || v < 0) return EINVAL;
      switch (optname) {
        case RDMA_SQSIZE:
          s.sq_size = static_cast<std::uint32_t>(std::min(v, 0xFFFE));
          return 0;
        case RDMA_RQSIZE:
          s.rq_size = static_cast<std::uint32_t>(std::min(v, 0xFFFE));
          return 0;
        case RDMA_INLINE:
          s.inline_size = static_cast<std::uint32_t>(std::min(v, 0xFFFE));
          return 0;
        case RDMA_IOMAPSIZE:
          // Rounded as the 8-bit scale of the connection data will carry it.
          s.iomap_size =
              siwx::rs::wire::ScaleDecode(siwx::rs::wire::ScaleEncode(std::min(v, 0x7F00)));
          return 0;
        default:
          return ENOTSUP;
      }
    default:
      return ENOTSUP;
  }
}

int GetOption(Socket& s, int level, int optname, void* optval, socklen_t* optlen) {
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          return PutInt(optval, optlen, GetBit(s.so_opts, optname)) ? 0 : EINVAL;
        case SO_RCVBUF:
          return PutInt(optval, optlen, static_cast<int>(s.rbuf_size)) ? 0 : EINVAL;
        case SO_SNDBUF:
          return PutInt(optval, optlen, static_cast<int>(s.sbuf_size)) ? 0 : EINVAL;
        case SO_TYPE:
          return PutInt(optval, optlen, SOCK_STREAM) ? 0 : EINVAL;
        case SO_LINGER: {
          if (optval == nullptr || optlen == nullptr ||
              *optlen < static_cast<socklen_t>(sizeof(linger))) {
            return EINVAL;
          }
          linger l{GetBit(s.so_opts, optname) ? 1 : 0, 0};
          std::memcpy(optval, &l, sizeof(l));
          *optlen = sizeof(l);
          return 0;
        }
        case SO_ERROR: {
          siwx::rs::Progress(s);
          const int e = s.so_error;
          if (!PutInt(optval, optlen, e)) return EINVAL;
          s.so_error = 0;
          return 0;
        }
        default:
          return ENOTSUP;
      }
    case IPPROTO_IP:
      if (optname != IP_TOS) return ENOTSUP;
      return PutInt(optval, optlen, s.ip_tos) ? 0 : EINVAL;
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          return PutInt(optval, optlen, GetBit(s.tcp_opts, optname)) ? 0 : EINVAL;
        case TCP_KEEPIDLE:
          return PutInt(optval, optlen, s.keepalive_time) ? 0 : EINVAL;
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
          return PutInt(optval, optlen, 1) ? 0 : EINVAL;
        case TCP_MAXSEG:
          return PutInt(optval, optlen, 2048) ? 0 : EINVAL;
        case TCP_INFO: {
          // As stock: the state and the send queue size; the rest zero.
          if (optval == nullptr || optlen == nullptr) return EINVAL;
          tcp_info info{};
          info.tcpi_state = s.phase == siwx::rs::Phase::kConnected && (s.readable || s.writable)
                                ? TCP_ESTABLISHED
                                : TCP_CLOSE;
          info.tcpi_snd_cwnd = s.sq_size;
          const socklen_t n = std::min<socklen_t>(*optlen, sizeof(info));
          std::memcpy(optval, &info, n);
          *optlen = n;
          return 0;
        }
        default:
          return ENOTSUP;
      }
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return ENOTSUP;
      return PutInt(optval, optlen, GetBit(s.ipv6_opts, optname)) ? 0 : EINVAL;
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE:
          return PutInt(optval, optlen, static_cast<int>(s.sq_size)) ? 0 : EINVAL;
        case RDMA_RQSIZE:
          return PutInt(optval, optlen, static_cast<int>(s.rq_size)) ? 0 : EINVAL;
        case RDMA_INLINE:
          return PutInt(optval, optlen, static_cast<int>(s.inline_size)) ? 0 : EINVAL;
        case RDMA_IOMAPSIZE:
          return PutInt(optval, optlen, s.iomap_size) ? 0 : EINVAL;
        default:
          return ENOTSUP;
      }
    default:
      return ENOTSUP;
  }
}

// A blocking rpoll sleeps on these descriptors, then maps events back.
struct PollPlan {
  std::vector<pollfd> fds;
  std::vector<int> owner;           // index into the caller's array
  std::vector<SocketPtr> waiting;   // sockets whose waiters count includes us
};

int CheckAll(pollfd* fds, nfds_t nfds, std::vector<SocketPtr>& socks) {
  int ready = 0;
  std::vector<pollfd> plain;
  std::vector<nfds_t> plain_at;
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    if (socks[i] != nullptr) {
      std::lock_guard lock(socks[i]->mu);
      if (socks[i]->closed) {
        fds[i].revents = POLLNVAL;
      } else {
        siwx::rs::Progress(*socks[i]);
        fds[i].revents = siwx::rs::Revents(*socks[i], fds[i].events);
      }
    } else if (fds[i].fd >= 0) {
      plain.push_back({fds[i].fd, fds[i].events, 0});
      plain_at.push_back(i);
    }
  }
  if (!plain.empty() && poll(plain.data(), plain.size(), 0) > 0) {
    for (std::size_t k = 0; k < plain.size(); ++k) fds[plain_at[k]].revents = plain[k].revents;
  }
  for (nfds_t i = 0; i < nfds; ++i) {
    if (fds[i].revents != 0) ++ready;
  }
  return ready;
}

int Poll(pollfd* fds, nfds_t nfds, int timeout) {
  if (fds == nullptr && nfds != 0) return Fail(EFAULT);
  std::vector<SocketPtr> socks(nfds);
  for (nfds_t i = 0; i < nfds; ++i) socks[i] = siwx::rs::Lookup(fds[i].fd);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int ready = CheckAll(fds, nfds, socks);
    if (ready != 0 || timeout == 0) return ready;
    // Arm, look once more (a completion may have come in between), sleep.
    PollPlan plan;
    for (nfds_t i = 0; i < nfds; ++i) {
      if (socks[i] != nullptr) {
        std::lock_guard lock(socks[i]->mu);
        if (socks[i]->closed) continue;
        siwx::rs::ArmForWait(*socks[i]);
        ++socks[i]->waiters;  // another thread's progress wakes us (SignalWake)
        plan.waiting.push_back(socks[i]);
        pollfd w[3];
        const int n = siwx::rs::WaitFds(*socks[i], w);
        for (int k = 0; k < n; ++k) {
          plan.fds.push_back(w[k]);
          plan.owner.push_back(static_cast<int>(i));
        }
      } else {
        plan.fds.push_back({fds[i].fd, fds[i].events, 0});
        plan.owner.push_back(static_cast<int>(i));
      }
    }
    auto stop_waiting = [&] {
      for (const SocketPtr& sp : plan.waiting) {
        std::lock_guard lock(sp->mu);
        --sp->waiters;
      }
      plan.waiting.clear();
    };
    ready = CheckAll(fds, nfds, socks);
    int sleep_ms = 500;
    if (timeout > 0) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - start).count();
      if (spent >= timeout && ready == 0) {
        stop_waiting();
        return 0;
      }
      sleep_ms = static_cast<int>(std::min<long long>(timeout - spent, sleep_ms));
    }
    if (ready != 0) {
      stop_waiting();
      return ready;
    }
    const int rc = poll(plan.fds.data(), plan.fds.size(), sleep_ms);
    const int poll_errno = errno;
    stop_waiting();
    if (rc < 0 && poll_errno != EINTR) {
      errno = poll_errno;
      return -1;
    }
    for (std::size_t k = 0; k < plan.fds.size(); ++k) {
      const int i = plan.owner[k];
      if (socks[i] == nullptr || plan.fds[k].revents == 0) continue;
      std::lock_guard lock(socks[i]->mu);
      if (!socks[i]->closed) siwx::rs::AfterWait(*socks[i], &plan.fds[k], 1);
    }
  }
}

template <typename Fn>
auto WithSocket(int fd, Fn&& fn) -> decltype(fn(std::declval<Socket&>(),
                                                 std::declval<std::unique_lock<std::mutex>&>())) {
  SocketPtr s = siwx::rs::Lookup(fd);
  if (s == nullptr) {
    errno = EBADF;
    return -1;
  }
  std::unique_lock lk(s->mu);
  if (s->closed) {
    errno = EBADF;
    return -1;
  }
  return fn(*s, lk);
}

ssize_t RecvOne(int fd, void* buf, std::size_t len, int flags) {
  return Guarded([&]() -> ssize_t {
    return WithSocket(fd, [&](Socket& s, std::unique_lock<std::mutex>& lk) -> ssize_t {
      return CountOrFail(siwx::rs::Recv(s, lk, buf, len, flags));
    });
  });
}

ssize_t SendIov(int fd, const iovec* iov, int iovcnt, int flags) {
  if (iovcnt < 0 || (iov == nullptr && iovcnt > 0)) return Fail(EINVAL);
  return Guarded([&]() -> ssize_t {
    return WithSocket(fd, [&](Socket& s, std::unique_lock<std::mutex>& lk) -> ssize_t {
      return CountOrFail(siwx::rs::SendV(s, lk, iov, iovcnt, flags));
    });
  });
}

// Fills the vectors in turn; after the first octets only what is there.
ssize_t RecvIov(int fd, const iovec* iov, int iovcnt, int flags) {
  if (iovcnt < 0 || (iov == nullptr && iovcnt > 0)) return Fail(EINVAL);
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    const ssize_t n = RecvOne(fd, iov[i].iov_base, iov[i].iov_len,
                              total > 0 ? (flags | MSG_DONTWAIT) : flags);
    if (n < 0) return total > 0 ? total : -1;
    total += n;
    if (static_cast<std::size_t>(n) < iov[i].iov_len || (flags & MSG_PEEK)) break;
  }
  return total;
}

// Said once per process, unless socket() is interposed (librspreload):
// there rsocket() is asked about every socket and a refused UDP socket
// falls back to a kernel one, which is what the application needs.
void ExplainNoDatagrams() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info{};
    void* socket_fn = dlsym(RTLD_DEFAULT, "socket");
    const bool interposed = socket_fn != nullptr && dladdr(socket_fn, &info) != 0 &&
                            info.dli_fname != nullptr &&
                            std::strstr(info.dli_fname, "libc.so") == nullptr;
    if (interposed) {
      SIWX_LOG(kInfo, "rsocket: SOCK_DGRAM refused (iWARP has no UD QPs); socket() is "
               "interposed by %s, which uses a kernel socket instead", info.dli_fname);
      return;
    }
    SIWX_LOG(kError, "rsocket: datagram rsockets (SOCK_DGRAM) need UD QPs, which iWARP does "
             "not have; siwx provides SOCK_STREAM rsockets only (EOPNOTSUPP)");
  });
}

}  // namespace

extern "C" {

int rsocket(int domain, int type, int protocol) {
  const int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (domain != AF_INET && domain != AF_INET6) {
    return Fail(domain == AF_IB ? EAFNOSUPPORT : ENOTSUP);
  }
  if (base == SOCK_DGRAM) {
    ExplainNoDatagrams();
    return Fail(EOPNOTSUPP);
  }
  if (base != SOCK_STREAM || (protocol != 0 && protocol != IPPROTO_TCP)) return Fail(ENOTSUP);
  return Guarded([&]() -> int {
    SocketPtr s;
    if (const int rc = siwx::rs::NewSocket(domain, type, &s); rc != 0) return Fail(rc);
    siwx::rs::Register(s);
    return s->index;
  });
}

int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  if (addr == nullptr || addrlen < static_cast<socklen_t>(sizeof(sockaddr_in))) {
    return Fail(EINVAL);
  }
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      if (s.phase != siwx::rs::Phase::kInit || s.bound) return Fail(EINVAL);
      if (rdma_bind_addr(s.id, const_cast<sockaddr*>(addr)) != 0) return -1;
      s.bound = true;
      return 0;
    });
  });
}

int rlisten(int socket, int backlog) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      const int rc = siwx::rs::Listen(s, backlog);
      return rc == 0 ? 0 : Fail(rc);
    });
  });
}

int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& l, std::unique_lock<std::mutex>& lk) {
      SocketPtr child;
      if (const int rc = siwx::rs::Accept(l, lk, &child); rc != 0) return Fail(rc);
      siwx::rs::Register(child);
      if (addr != nullptr && addrlen != nullptr) {
        std::lock_guard clock(child->mu);
        CopyAddr(addr, addrlen, rdma_get_peer_addr(child->id));
      }
      return child->index;
    });
  });
}

int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  if (addr == nullptr || addrlen < static_cast<socklen_t>(sizeof(sockaddr_in))) {
    return Fail(EINVAL);
  }
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>& lk) {
      const int rc = siwx::rs::Connect(s, lk, addr);
      return rc == 0 ? 0 : Fail(rc);
    });
  });
}

int rshutdown(int socket, int how) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>& lk) {
      const int rc = siwx::rs::Shutdown(s, lk, how);
      return rc == 0 ? 0 : Fail(rc);
    });
  });
}

int rclose(int socket) {
  return Guarded([&] {
    SocketPtr s = siwx::rs::Unregister(socket);
    if (s == nullptr) return Fail(EBADF);
    std::unique_lock lk(s->mu);
    siwx::rs::Close(s, lk);
    return 0;
  });
}

ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  if (buf == nullptr && len != 0) return Fail(EFAULT);
  return RecvOne(socket, buf, len, flags);
}

ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr,
                  socklen_t* addrlen) {
  const ssize_t n = rrecv(socket, buf, len, flags);
  if (n >= 0 && src_addr != nullptr && addrlen != nullptr) {
    const int saved = errno;
    (void)rgetpeername(socket, src_addr, addrlen);
    errno = saved;
  }
  return n;
}

ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (msg == nullptr) return Fail(EFAULT);
  if (msg->msg_control != nullptr && msg->msg_controllen != 0) return Fail(ENOTSUP);
  const ssize_t n = RecvIov(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  if (n >= 0) msg->msg_flags = 0;
  return n;
}

ssize_t rread(int socket, void* buf, size_t count) { return rrecv(socket, buf, count, 0); }

ssize_t rreadv(int socket, const iovec* iov, int iovcnt) {
  return RecvIov(socket, iov, iovcnt, 0);
}

ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  if (buf == nullptr && len != 0) return Fail(EFAULT);
  const iovec one{const_cast<void*>(buf), len};
  return SendIov(socket, &one, 1, flags);
}

ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr,
                socklen_t addrlen) {
  if (dest_addr != nullptr || addrlen != 0) {
    // A connected stream socket: as TCP, the address must not be given.
    const SocketPtr s = siwx::rs::Lookup(socket);
    if (s == nullptr) return Fail(EBADF);
    return Fail(EISCONN);
  }
  return rsend(socket, buf, len, flags);
}

ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (msg == nullptr) return Fail(EFAULT);
  if (msg->msg_control != nullptr && msg->msg_controllen != 0) return Fail(ENOTSUP);
  return SendIov(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }

ssize_t rwritev(int socket, const iovec* iov, int iovcnt) {
  return SendIov(socket, iov, iovcnt, 0);
}

int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  return Guarded([&] { return Poll(fds, nfds, timeout); });
}

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return Fail(EINVAL);
  return Guarded([&]() -> int {
    std::vector<pollfd> fds;
    for (int fd = 0; fd < nfds; ++fd) {
      short ev = 0;
      if (readfds != nullptr && FD_ISSET(fd, readfds)) ev |= POLLIN;
      if (writefds != nullptr && FD_ISSET(fd, writefds)) ev |= POLLOUT;
      const bool except = exceptfds != nullptr && FD_ISSET(fd, exceptfds);
      if (ev != 0 || except) fds.push_back({fd, ev, 0});
    }
    const int ms = timeout == nullptr
                       ? -1
                       : static_cast<int>(timeout->tv_sec * 1000 + timeout->tv_usec / 1000);
    const int rc = Poll(fds.data(), fds.size(), ms);
    if (rc < 0) return -1;
    if (readfds != nullptr) FD_ZERO(readfds);
    if (writefds != nullptr) FD_ZERO(writefds);
    if (exceptfds != nullptr) FD_ZERO(exceptfds);
    int count = 0;
    for (const pollfd& p : fds) {
      if (readfds != nullptr && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        FD_SET(p.fd, readfds);
        ++count;
      }
      if (writefds != nullptr && (p.revents & (POLLOUT | POLLERR))) {
        FD_SET(p.fd, writefds);
        ++count;
      }
      if (exceptfds != nullptr && (p.revents & POLLPRI)) {
        FD_SET(p.fd, exceptfds);
        ++count;
      }
    }
    return count;
  });
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  if (addr == nullptr || addrlen == nullptr) return Fail(EFAULT);
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      if (s.phase != siwx::rs::Phase::kConnected && s.phase != siwx::rs::Phase::kAccepting) {
        return Fail(ENOTCONN);
      }
      CopyAddr(addr, addrlen, rdma_get_peer_addr(s.id));
      return 0;
    });
  });
}

int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  if (addr == nullptr || addrlen == nullptr) return Fail(EFAULT);
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      sockaddr* local = rdma_get_local_addr(s.id);
      if (local->sa_family == AF_UNSPEC) {
        // Not bound yet: the wildcard address of the socket's family.
        sockaddr_storage any{};
        any.ss_family = static_cast<sa_family_t>(s.domain);
        CopyAddr(addr, addrlen, reinterpret_cast<sockaddr*>(&any));
      } else {
        CopyAddr(addr, addrlen, local);
      }
      return 0;
    });
  });
}

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      const int rc = SetOption(s, level, optname, optval, optlen);
      return rc == 0 ? 0 : Fail(rc);
    });
  });
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      const int rc = GetOption(s, level, optname, optval, optlen);
      return rc == 0 ? 0 : Fail(rc);
    });
  });
}

int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const int arg = (cmd == F_SETFL || cmd == F_SETFD) ? va_arg(ap, int) : 0;
  va_end(ap);
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      switch (cmd) {
        case F_GETFL:
          return s.fs_flags | O_RDWR;
        case F_SETFL:
          s.fs_flags = arg & O_NONBLOCK;
          return 0;
        case F_GETFD:
          return s.fd_flags;
        case F_SETFD:
          s.fd_flags = arg & FD_CLOEXEC;  // recorded; siwx's descriptors stay close-on-exec
          return 0;
        default:
          return Fail(ENOTSUP);
      }
    });
  });
}

off_t riomap(int socket, void* buf, size_t len, int prot, int /*flags*/, off_t offset) {
  if (buf == nullptr || len == 0 || (prot & ~(PROT_WRITE | PROT_NONE)) != 0) return Fail(EINVAL);
  return Guarded([&]() -> off_t {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) -> off_t {
      // Memory registration needs the connection's protection domain.
      if (s.pd == nullptr) return Fail(EINVAL);
      siwx::rs::LocalIomap m;
      int access = IBV_ACCESS_LOCAL_WRITE;
      if (prot & PROT_WRITE) {
        std::vector<bool> used(s.remote_iomap.length, false);
        for (const auto& e : s.iomaps) {
          if (e.index >= 0) used[static_cast<std::size_t>(e.index)] = true;
        }
        for (std::size_t i = 0; i < used.size(); ++i) {
          if (!used[i]) {
            m.index = static_cast<int>(i);
            break;
          }
        }
        // The peer's table is full, or it offered none (RDMA_IOMAPSIZE 0).
        if (m.index < 0) return Fail(ENOMEM);
        access |= IBV_ACCESS_REMOTE_WRITE;
      }
      m.mr = ibv_reg_mr(s.pd, buf, len, access);
      if (m.mr == nullptr) return -1;
      m.addr = buf;
      m.len = len;
      m.offset = offset == -1 ? reinterpret_cast<std::uintptr_t>(buf)
                              : static_cast<std::uint64_t>(offset);
      s.iomaps.push_back(m);
      if (m.index >= 0) s.iomap_pending = true;
      return static_cast<off_t>(m.offset);
    });
  });
}

int riounmap(int socket, void* buf, size_t len) {
  return Guarded([&] {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>&) {
      for (auto it = s.iomaps.begin(); it != s.iomaps.end(); ++it) {
        if (it->addr == buf && it->len == len) {
          ibv_dereg_mr(it->mr);
          s.iomaps.erase(it);
          return 0;
        }
      }
      return Fail(EINVAL);
    });
  });
}

size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  if (buf == nullptr && count != 0) return static_cast<size_t>(Fail(EFAULT));
  const ssize_t n = Guarded([&]() -> ssize_t {
    return WithSocket(socket, [&](Socket& s, std::unique_lock<std::mutex>& lk) -> ssize_t {
      return CountOrFail(
          siwx::rs::IoWrite(s, lk, buf, count, static_cast<std::uint64_t>(offset), flags));
    });
  });
  return static_cast<size_t>(n);
}

}  // extern "C"
