// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The CM's short name for the socket, epoll and eventfd calls of
// common/transport/ (socket_ops.h, tcp_stream.h), the only place that makes
// them: net::SockAddr, net::Poller, net::Close, ...
#pragma once

#include "common/transport/socket_ops.h"
#include "common/transport/tcp_stream.h"

namespace siwx::cm {
namespace net = ::siwx::transport;
}  // namespace siwx::cm
