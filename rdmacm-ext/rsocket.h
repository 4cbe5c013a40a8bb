// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// rsockets (rdma/rsocket.h) for siwx: stream sockets over RC QPs, built on
// siwx's own rdma_cm API and the public verbs. Stock rsockets live inside
// stock librdmacm and use its private id structures, so librdmacm-siwx.so
// provides the rsocket calls itself (rsocket_api.cc exports them with
// librdmacm's RDMACM_1.0 version node).
//
// The protocol is the iWARP variant of stock rsockets (docs/rsockets.md):
// data by RDMA Write into the receive buffer the peer advertised, each
// write followed by a 4-octet Send carrying the rsocket message (iWARP has
// no RDMA Write with Immediate); receive buffers and credits granted by
// RDMA Write into the peer's target SGL plus an SGL message. Private data
// and messages are those of wire::; a stock rsockets peer over kernel siw
// interoperates.
//
// One Socket per rsocket. Every field is guarded by `mu`; waits release it
// while they sleep in poll(2), so a thread blocked in rrecv does not stop
// another from sending.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "rdmacm-ext/rsocket_wire.h"

namespace siwx::rs {

enum class Phase {
  kInit,            // created, maybe bound
  kListening,
  kResolvingAddr,   // rconnect: waiting for ADDR_RESOLVED
  kResolvingRoute,  // waiting for ROUTE_RESOLVED
  kConnecting,      // rdma_connect sent, waiting for ESTABLISHED
  kAccepting,       // accepted, waiting for ESTABLISHED
  kConnected,       // see readable/writable for the directions still open
  kConnectError,    // so_error says why
};

struct LocalIomap {
  void* addr = nullptr;
  std::size_t len = 0;
  ibv_mr* mr = nullptr;
  std::uint64_t offset = 0;
  int index = -1;  // slot in the peer's iomap table; -1: local only (PROT_NONE)
  bool sent = false;
};

struct Socket {
  int index = -1;  // an eventfd: the descriptor number the application holds
  int domain = AF_INET;
  std::mutex mu;
  Phase phase = Phase::kInit;
  bool bound = false;
  bool closed = false;
  bool readable = false;  // kConnected: more data may still arrive
  bool writable = false;  // kConnected: rsend is allowed
  bool peer_gone = false;       // the QP's stream ended (flush, DISCONNECTED)
  bool stream_ended = false;    // the QP flushed its receives: TCP is closed
  bool peer_closed = false;     // the peer sent a DISCONNECT message
  bool disconnect_sent = false;  // our DISCONNECT message is posted
  bool cm_disconnected = false;  // rdma_disconnect called
  int so_error = 0;
  int fs_flags = 0;  // O_NONBLOCK
  int fd_flags = 0;  // FD_CLOEXEC
  int waiters = 0;   // threads asleep in Wait()
  std::chrono::steady_clock::time_point linger_deadline;  // closed, waiting for the peer

  // Options (set before the connection; inherited by accepted sockets).
  std::uint32_t sbuf_size = 0;
  std::uint32_t rbuf_size = 0;
  std::uint32_t sq_size = 0;
  std::uint32_t rq_size = 0;
  std::uint32_t inline_size = 0;  // reported only: siwx copies every message
  int iomap_size = 0;             // entries of our table the peer may fill
  std::uint64_t so_opts = 0;
  std::uint64_t tcp_opts = 0;
  std::uint64_t ipv6_opts = 0;
  int keepalive_time = 0;
  int ip_tos = 0;

  // Connection manager objects.
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  std::deque<std::shared_ptr<Socket>> accept_queue;  // listener: accepted, not yet taken
  int backlog = 0;                                   // listener: bound of accept_queue

  // Verbs objects (connected sockets).
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  unsigned unacked_cq_events = 0;
  std::uint32_t sq_total = 0;  // sq_size plus the control reserve
  std::uint32_t rq_total = 0;  // rq_size plus spare receives for control messages
  std::uint32_t sq_used = 0;

  // Send ring (sbuf_size octets) followed by per-WR scratch slots.
  std::uint8_t* sbuf = nullptr;
  ibv_mr* smr = nullptr;
  std::uint32_t shead = 0;
  std::uint32_t sbuf_avail = 0;
  std::uint64_t scratch_next = 0;
  // Receive ring (rbuf_size octets) followed by one 4-octet slot per receive.
  std::uint8_t* rbuf = nullptr;
  ibv_mr* rmr = nullptr;
  std::uint32_t roffset = 0;      // next octet the application reads
  std::uint32_t rfree_offset = 0;  // next half to advertise
  std::uint32_t rbuf_avail = 0;    // free octets not yet advertised
  std::deque<std::uint32_t> rmsg;  // lengths of received, unread DATA messages
  std::uint32_t rqueued = 0;       // their sum
  // Target SGL and iomap table, written by the peer.
  std::uint8_t* tables = nullptr;
  ibv_mr* tmr = nullptr;
  wire::Sge sgl[wire::kSglSize];  // our copies, refreshed on SGL messages
  int target_sge = 0;
  std::vector<wire::Iomap> peer_iomaps;  // refreshed on IOMAP_SGL messages

  // The peer.
  wire::Sge remote_sgl;    // its target SGL (length: entries)
  int remote_sge = 1;      // next entry of it we write
  wire::Sge remote_iomap;  // its iomap table (length: entries)
  bool swap = false;       // the peer's byte order differs from ours
  std::uint16_t sseq_no = 0;
  std::uint16_t sseq_comp = 0;
  std::uint16_t rseq_no = 0;
  std::uint16_t rseq_comp = 0;

  std::vector<LocalIomap> iomaps;
  bool iomap_pending = false;
};

// Defaults (stock rsockets' built-in values).
inline constexpr std::uint32_t kDefaultQueueSize = 384;
inline constexpr std::uint32_t kDefaultBufferSize = 1 << 17;
inline constexpr std::uint32_t kDefaultInline = 64;

// Operations: 0 or an errno value (ssize_t ones: a count or -errno). `lk`
// holds s.mu and may be released while the call waits.
std::shared_ptr<Socket> Lookup(int index);
void Register(const std::shared_ptr<Socket>& s);
std::shared_ptr<Socket> Unregister(int index);

int NewSocket(int domain, int type, std::shared_ptr<Socket>* out);
int Connect(Socket& s, std::unique_lock<std::mutex>& lk, const sockaddr* addr);
int Listen(Socket& s, int backlog);
int Accept(Socket& l, std::unique_lock<std::mutex>& lk, std::shared_ptr<Socket>* out);
int AwaitConnected(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock);
ssize_t SendV(Socket& s, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt,
              int flags);
ssize_t Recv(Socket& s, std::unique_lock<std::mutex>& lk, void* buf, std::size_t len, int flags);
ssize_t IoWrite(Socket& s, std::unique_lock<std::mutex>& lk, const void* buf, std::size_t count,
                std::uint64_t offset, int flags);
int Shutdown(Socket& s, std::unique_lock<std::mutex>& lk, int how);
int Close(const std::shared_ptr<Socket>& s, std::unique_lock<std::mutex>& lk);
void DestroySocket(Socket& s);

// Polling: progress without blocking, the events ready now, and the
// descriptors (at most 3) to sleep on until something may have changed.
bool Progress(Socket& s);
short Revents(Socket& s, short events);
void ArmForWait(Socket& s);
int WaitFds(const Socket& s, pollfd* fds);
void AfterWait(Socket& s, const pollfd* fds, int n);
int WaitUntil(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock,
              const std::function<bool()>& ready, int timeout_ms);

}  // namespace siwx::rs
