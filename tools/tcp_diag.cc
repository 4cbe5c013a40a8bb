// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "tools/tcp_diag.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace siwx::tools {
namespace {

void FillAddress(const transport::Endpoint& e, __be32 out[4]) {
  std::memset(out, 0, 16);
  std::memcpy(out, e.address, e.family == AF_INET ? 4 : 16);
}

}  // namespace

std::optional<TcpDiag> QueryTcpDiag(const transport::Endpoint& local,
                                    const transport::Endpoint& peer) {
  if (!local.known() || local.family != peer.family) return std::nullopt;
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return std::nullopt;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;  // one socket, by its exact id
  message.request.sdiag_family = static_cast<__u8>(local.family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_ext = 1u << (INET_DIAG_INFO - 1);
  message.request.idiag_states = ~0u;
  message.request.id.idiag_sport = htons(local.port);
  message.request.id.idiag_dport = htons(peer.port);
  FillAddress(local, message.request.id.idiag_src);
  FillAddress(peer, message.request.id.idiag_dst);
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<TcpDiag> result;
  if (sendto(fd, &message, sizeof(message), 0, reinterpret_cast<sockaddr*>(&kernel),
             sizeof(kernel)) == static_cast<ssize_t>(sizeof(message))) {
    // One answer (or an NLMSG_ERROR when there is no such socket). Read with
    // memcpy: the netlink macros cast unaligned pointers.
    char buffer[8192];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    nlmsghdr header{};
    if (n >= static_cast<ssize_t>(NLMSG_LENGTH(sizeof(inet_diag_msg)))) {
      std::memcpy(&header, buffer, sizeof(header));
    }
    const std::size_t length = std::min<std::size_t>(header.nlmsg_len, n > 0 ? n : 0);
    if (header.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        length >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      inet_diag_msg diag{};
      std::memcpy(&diag, buffer + NLMSG_HDRLEN, sizeof(diag));
      TcpDiag d;
      d.state = diag.idiag_state;
      std::size_t at = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(inet_diag_msg));
      while (at + sizeof(rtattr) <= length) {
        rtattr attr{};
        std::memcpy(&attr, buffer + at, sizeof(attr));
        if (attr.rta_len < sizeof(rtattr) || at + attr.rta_len > length) break;
        if (attr.rta_type == INET_DIAG_INFO) {
          tcp_info info{};
          std::memcpy(&info, buffer + at + RTA_LENGTH(0),
                      std::min<std::size_t>(attr.rta_len - RTA_LENGTH(0), sizeof(info)));
          d.total_retransmits = info.tcpi_total_retrans;
          d.rtt_us = info.tcpi_rtt;
        }
        at += RTA_ALIGN(attr.rta_len);
      }
      result = d;
    }
  }
  close(fd);
  return result;
}

}  // namespace siwx::tools
