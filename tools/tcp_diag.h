// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What TCP knows about a connection of another process, by its addresses:
// NETLINK_SOCK_DIAG (inet_diag) answers for any socket of the network
// namespace without privileges, as `ss -ti` does. `siwx stat` uses it for
// the retransmits of each QP's connection.
#pragma once

#include <cstdint>
#include <optional>

#include "common/transport/endpoints.h"

namespace siwx::tools {

struct TcpDiag {
  std::uint32_t total_retransmits = 0;  // tcpi_total_retrans
  std::uint32_t rtt_us = 0;             // tcpi_rtt
  std::uint8_t state = 0;               // TCP_ESTABLISHED, ...
};

// std::nullopt when no such connection is visible (closed, or in another
// network namespace) or netlink cannot be used.
std::optional<TcpDiag> QueryTcpDiag(const transport::Endpoint& local,
                                    const transport::Endpoint& peer);

}  // namespace siwx::tools
