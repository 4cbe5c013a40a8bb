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
    alignas(nlmsghdr) char buffer[8192];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    auto* reply = reinterpret_cast<nlmsghdr*>(buffer);
    int left = static_cast<int>(n);
    for (; n > 0 && NLMSG_OK(reply, left); reply = NLMSG_NEXT(reply, left)) {
      if (reply->nlmsg_type != SOCK_DIAG_BY_FAMILY) break;  // NLMSG_ERROR: none such
      auto* diag = static_cast<inet_diag_msg*>(NLMSG_DATA(reply));
      TcpDiag d;
      d.state = diag->idiag_state;
      int attr_left = static_cast<int>(reply->nlmsg_len - NLMSG_LENGTH(sizeof(*diag)));
      for (auto* attr = reinterpret_cast<rtattr*>(diag + 1); RTA_OK(attr, attr_left);
           attr = RTA_NEXT(attr, attr_left)) {
        if (attr->rta_type != INET_DIAG_INFO) continue;
        tcp_info info{};
        std::memcpy(&info, RTA_DATA(attr),
                    std::min<std::size_t>(RTA_PAYLOAD(attr), sizeof(info)));
        d.total_retransmits = info.tcpi_total_retrans;
        d.rtt_us = info.tcpi_rtt;
      }
      result = d;
      break;
    }
  }
  close(fd);
  return result;
}

}  // namespace siwx::tools
