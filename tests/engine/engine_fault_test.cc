// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Fault injection between two engine QPs (RFC 5044 is a byte stream: TCP
// may cut, delay, corrupt or close it anywhere).
//  - Short writes: tiny socket buffers make every sendmsg partial; large
//    messages still arrive intact, with CRC and markers.
//  - Segmentation: a relay forwards the stream one octet at a time (each
//    octet read by the engine on its own) or in random chunks with random
//    delays; data and completions are unchanged.
//  - FIN and RST in the middle of a large message, in both directions and
//    inside a Read Response: the surviving QP completes every WR with the
//    specified status, raises the event, sends nothing more than the RFC
//    allows, leaks no descriptor and never hangs.
//  - A corrupted octet (CRC on: LLP CRC Terminate; CRC off: the DDP or MPA
//    Terminate its field calls for) and a truncated stream.
//  - Destroying a QP, or a whole engine, while traffic is in flight.
// Every wait is bounded; a watchdog aborts a test that would hang.
#include <gtest/gtest.h>

#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using rdmap::TerminateCause;

constexpr std::chrono::seconds kTestLimit{120};  // watchdog per test

// ---- Socket helpers ----

// SO_SNDBUF / SO_RCVBUF before Bind; returns what the kernel set (Linux
// doubles the request for bookkeeping overhead).
int SetBuffer(int fd, int option, int bytes) {
  EXPECT_EQ(setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof(bytes)), 0);
  int got = 0;
  socklen_t len = sizeof(got);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, option, &got, &len), 0);
  return got;
}

void AbortiveClose(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

// ---- The relay ----

// A man in the middle between QP a and QP b. One thread forwards both
// directions; each direction can be paced (as is, one octet at a time in
// lockstep with the reader, or random chunks after random delays), held
// until released, have one octet corrupted, and one direction can be cut:
//  - kTruncate: after `after` octets the receiver gets FIN; the rest of the
//    direction is read and dropped; the other direction keeps flowing.
//  - kFin: after `after` octets of `dir`, the `survivor` leg gets FIN (the
//    relay keeps reading what the survivor still sends) and the other leg
//    is reset: the survivor's peer closed in an orderly way.
//  - kRst: both legs are reset: the survivor's peer vanished.
// Everything read from each source is recorded as it was sent (before any
// corruption) so tests can parse exactly what a QP put on the wire.
class Relay {
 public:
  enum Dir : std::size_t { kAtoB = 0, kBtoA = 1 };
  enum Leg : std::size_t { kLegA = 0, kLegB = 1 };
  enum class Pace : std::uint8_t { kPass, kOctetLockstep, kRandomChunks };
  enum class CutKind : std::uint8_t { kTruncate, kFin, kRst };
  struct Cut {
    Dir dir = kAtoB;
    std::uint64_t after = 0;
    CutKind kind = CutKind::kTruncate;
    Leg survivor = kLegB;
  };
  struct Options {
    Transport legs = Transport::kTcp;
    Pace pace = Pace::kPass;
    std::uint64_t seed = 1;         // kRandomChunks
    std::size_t max_chunk = 1460;   // kRandomChunks
    int max_delay_us = 200;         // kRandomChunks
    std::optional<Dir> corrupt_dir;
    std::uint64_t corrupt_at = 0;   // stream offset of the octet to corrupt
    std::uint8_t corrupt_xor = 0;
    std::array<bool, 2> hold{};     // per Dir: forward nothing until Release
    std::optional<Cut> cut;
    int relay_rcvbuf = 0;           // SO_RCVBUF of the relay's sockets, 0 = default
  };
  struct Counts {
    std::uint64_t read = 0;       // octets read from the source leg
    std::uint64_t forwarded = 0;  // octets written to the destination leg
    bool source_closed = false;   // EOF or error on the source leg
    bool cut_done = false;
  };

  explicit Relay(const Options& options) : options_(options) {
    // Lockstep needs the AF_UNIX queue length, which drops when the reader
    // has consumed an octet (TCP's drops only when it is acknowledged).
    EXPECT_TRUE(options.pace != Pace::kOctetLockstep || options.legs == Transport::kSocketPair);
    const std::array<int, 2> pa = Connect(options.legs);  // QP a <-> relay leg a
    const std::array<int, 2> pb = Connect(options.legs);  // relay leg b <-> QP b
    qp_fds_ = {pa[0], pb[1]};
    fd_ = {pa[1], pb[0]};
    for (int fd : fd_) {
      if (options.relay_rcvbuf > 0) SetBuffer(fd, SO_RCVBUF, options.relay_rcvbuf);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // fails harmlessly on AF_UNIX
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Relay() {
    stop_.store(true);
    thread_.join();
    for (int fd : fd_) {
      if (fd >= 0) close(fd);
    }
    for (int fd : qp_fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // The QP end of a leg; the caller (Bind) owns it from now on.
  int TakeQpFd(Leg leg) { return std::exchange(qp_fds_[leg], -1); }

  void Release(Dir d) { released_[d].store(true); }

  Counts counts(Dir d) const {
    std::lock_guard lock(mutex_);
    return dirs_[d].counts;
  }
  std::vector<std::uint8_t> Record(Dir d) const {
    std::lock_guard lock(mutex_);
    return dirs_[d].record;
  }
  bool WaitFor(Dir d, const std::function<bool(const Counts&)>& pred,
               std::chrono::milliseconds timeout = kWait) const {
    return WaitUntil([&] { return pred(counts(d)); }, timeout);
  }

 private:
  static constexpr std::size_t kMaxPending = 8u << 20;  // read-ahead per direction
  static constexpr std::size_t kReadChunk = 64 * 1024;

  struct Direction {
    std::vector<std::uint8_t> pending;  // read, not yet forwarded
    std::size_t pending_at = 0;
    bool forwarding = true;             // false once cut or the destination died
    bool fin_sent = false;
    bool awaiting_reader = false;       // lockstep: the last octet is not consumed yet
    Clock::time_point next_write{};
    Counts counts;                      // guarded by mutex_
    std::vector<std::uint8_t> record;   // guarded by mutex_
  };

  static Leg From(std::size_t d) { return d == kAtoB ? kLegA : kLegB; }
  static Leg To(std::size_t d) { return d == kAtoB ? kLegB : kLegA; }
  std::size_t Pending(std::size_t d) const { return dirs_[d].pending.size() - dirs_[d].pending_at; }
  bool CutPending(std::size_t d) const {
    return options_.cut && options_.cut->dir == d && !dirs_[d].counts.cut_done;
  }
  bool Held(std::size_t d) const { return options_.hold[d] && !released_[d].load(); }

  void Run() {
    std::mt19937_64 rng(options_.seed);
    std::vector<std::uint8_t> buf(kReadChunk);
    while (!stop_.load()) {
      for (std::size_t d = 0; d < 2; ++d) {
        MaybeCut(d);
        MaybePropagateFin(d);
      }
      const Clock::time_point now = Clock::now();
      std::array<pollfd, 2> p{pollfd{-1, 0, 0}, pollfd{-1, 0, 0}};
      long timeout_us = 2000;
      std::array<bool, 2> want_read{}, want_write{};
      for (std::size_t d = 0; d < 2; ++d) {
        Direction& dir = dirs_[d];
        const int from = fd_[From(d)];
        const int to = fd_[To(d)];
        want_read[d] = from >= 0 && !dir.counts.source_closed && Pending(d) < kMaxPending &&
                       ReadRoom(d) > 0;
        if (want_read[d]) p[From(d)].events |= POLLIN;
        if (to < 0 || !dir.forwarding || Pending(d) == 0 || Held(d)) continue;
        if (CutPending(d) && dir.counts.forwarded >= options_.cut->after) continue;
        if (dir.awaiting_reader) {
          int queued = 0;
          if (ioctl(to, SIOCOUTQ, &queued) == 0 && queued == 0) {
            dir.awaiting_reader = false;
          } else {
            timeout_us = std::min(timeout_us, 20L);
            continue;
          }
        }
        if (now < dir.next_write) {
          const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(dir.next_write - now);
          timeout_us = std::min<long>(timeout_us, std::max<long>(1, wait.count()));
          continue;
        }
        want_write[d] = true;
        p[To(d)].events |= POLLOUT;
      }
      for (std::size_t leg = 0; leg < 2; ++leg) p[leg].fd = p[leg].events != 0 ? fd_[leg] : -1;
      timespec ts{0, timeout_us * 1000};
      if (ppoll(p.data(), p.size(), &ts, nullptr) <= 0) continue;
      for (std::size_t d = 0; d < 2; ++d) {
        if (want_read[d] && (p[From(d)].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          ReadSome(d, buf);
        }
      }
      for (std::size_t d = 0; d < 2; ++d) {
        if (want_write[d] && fd_[To(d)] >= 0 && (p[To(d)].revents & (POLLOUT | POLLHUP | POLLERR)) != 0) {
          WriteSome(d, rng);
        }
      }
    }
  }

  // Reading stops at a pending FIN or RST cut, so the sender cannot finish
  // its message into the relay's buffers before it; a truncation reads on.
  std::size_t ReadRoom(std::size_t d) const {
    if (!CutPending(d) || options_.cut->kind == CutKind::kTruncate) return kReadChunk;
    const std::uint64_t read = dirs_[d].counts.read;
    return read < options_.cut->after ? static_cast<std::size_t>(std::min<std::uint64_t>(
                                             kReadChunk, options_.cut->after - read))
                                      : 0;
  }

  void ReadSome(std::size_t d, std::vector<std::uint8_t>& buf) {
    Direction& dir = dirs_[d];
    const ssize_t n = recv(fd_[From(d)], buf.data(), ReadRoom(d), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      {
        std::lock_guard lock(mutex_);
        dir.counts.source_closed = true;
      }
      // A reset is passed on as a reset; an orderly close as FIN (below).
      if (n < 0 && dir.forwarding) AbortLeg(To(d));
      return;
    }
    const std::uint64_t start = dir.counts.read;
    {
      std::lock_guard lock(mutex_);
      dir.record.insert(dir.record.end(), buf.begin(), buf.begin() + n);
      dir.counts.read += static_cast<std::uint64_t>(n);
    }
    if (!dir.forwarding) return;
    const std::size_t at = dir.pending.size();
    dir.pending.insert(dir.pending.end(), buf.begin(), buf.begin() + n);
    if (options_.corrupt_dir == d && options_.corrupt_at >= start &&
        options_.corrupt_at < start + static_cast<std::uint64_t>(n)) {
      dir.pending[at + (options_.corrupt_at - start)] ^= options_.corrupt_xor;
    }
  }

  void WriteSome(std::size_t d, std::mt19937_64& rng) {
    Direction& dir = dirs_[d];
    std::size_t chunk = Pending(d);
    switch (options_.pace) {
      case Pace::kPass:
        chunk = std::min<std::size_t>(chunk, 256 * 1024);
        break;
      case Pace::kOctetLockstep:
        chunk = 1;
        break;
      case Pace::kRandomChunks:
        chunk = std::min<std::size_t>(chunk, 1 + rng() % options_.max_chunk);
        break;
    }
    if (CutPending(d)) {
      chunk = static_cast<std::size_t>(
          std::min<std::uint64_t>(chunk, options_.cut->after - dir.counts.forwarded));
    }
    const ssize_t n = send(fd_[To(d)], dir.pending.data() + dir.pending_at, chunk,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) {
      AbortLeg(To(d));  // the destination is gone
      return;
    }
    dir.pending_at += static_cast<std::size_t>(n);
    if (dir.pending_at == dir.pending.size()) {
      dir.pending.clear();
      dir.pending_at = 0;
    } else if (dir.pending_at > (1u << 20)) {
      dir.pending.erase(dir.pending.begin(), dir.pending.begin() + static_cast<std::ptrdiff_t>(dir.pending_at));
      dir.pending_at = 0;
    }
    {
      std::lock_guard lock(mutex_);
      dir.counts.forwarded += static_cast<std::uint64_t>(n);
    }
    if (options_.pace == Pace::kOctetLockstep) dir.awaiting_reader = true;
    if (options_.pace == Pace::kRandomChunks) {
      dir.next_write = Clock::now() + std::chrono::microseconds(
                                          rng() % static_cast<std::uint64_t>(options_.max_delay_us + 1));
    }
  }

  void MaybePropagateFin(std::size_t d) {
    Direction& dir = dirs_[d];
    if (dir.counts.source_closed && dir.forwarding && !dir.fin_sent && Pending(d) == 0 &&
        fd_[To(d)] >= 0) {
      shutdown(fd_[To(d)], SHUT_WR);
      dir.fin_sent = true;
    }
  }

  void StopForwarding(std::size_t d) {
    dirs_[d].forwarding = false;
    dirs_[d].pending.clear();
    dirs_[d].pending_at = 0;
  }

  void AbortLeg(Leg leg) {
    if (fd_[leg] < 0) return;
    AbortiveClose(fd_[leg]);
    fd_[leg] = -1;
    for (std::size_t d = 0; d < 2; ++d) {
      if (From(d) == leg) {
        std::lock_guard lock(mutex_);
        dirs_[d].counts.source_closed = true;
      }
      if (To(d) == leg) StopForwarding(d);
    }
  }

  void MaybeCut(std::size_t d) {
    if (!CutPending(d)) return;
    const Cut& cut = *options_.cut;
    Direction& dir = dirs_[d];
    if (dir.counts.forwarded < cut.after) return;
    const Leg other = cut.survivor == kLegA ? kLegB : kLegA;
    switch (cut.kind) {
      case CutKind::kTruncate:
        shutdown(fd_[To(d)], SHUT_WR);
        dir.fin_sent = true;
        StopForwarding(d);
        break;
      case CutKind::kFin:
        shutdown(fd_[cut.survivor], SHUT_WR);
        AbortLeg(other);
        StopForwarding(kAtoB);
        StopForwarding(kBtoA);
        break;
      case CutKind::kRst:
        AbortLeg(cut.survivor);
        AbortLeg(other);
        break;
    }
    std::lock_guard lock(mutex_);
    dir.counts.cut_done = true;
  }

  const Options options_;
  std::array<int, 2> qp_fds_{-1, -1};
  std::array<int, 2> fd_{-1, -1};  // relay thread only (after construction)
  std::array<Direction, 2> dirs_;
  std::array<std::atomic<bool>, 2> released_{};
  mutable std::mutex mutex_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- Traffic with exact expectations ----

struct ExchangeSizes {
  std::size_t send = 0;
  std::size_t write = 0;
  std::size_t read = 0;
};

// Both sides at once: each Sends (3 SGEs into a 2-SGE receive), Writes
// (2 SGEs) and Reads `sizes` octets to/from the other, then sends 4 inline
// octets that tell the peer its Writes were placed (RFC 5040 5.5). Every
// completion field, every target octet, the slack after the Send and the
// guards are checked.
class Exchange {
 public:
  static constexpr std::size_t kSlack = 8;
  static constexpr std::size_t kFinal = 4;

  Exchange(Node& a, Node& b, ExchangeSizes sizes) : sizes_(sizes) {
    sides_[0].node = &a;
    sides_[1].node = &b;
    for (std::size_t i = 0; i < 2; ++i) {
      Side& s = sides_[i];
      const std::uint32_t seed = static_cast<std::uint32_t>(10 * (i + 1));
      s.out = std::make_unique<Buffer>(sizes.send + sizes.write + sizes.read);
      for (std::size_t j = 0; j < sizes.send; ++j) s.out->data()[j] = PatternByte(seed + 1, j);
      for (std::size_t j = 0; j < sizes.write; ++j) {
        s.out->data()[sizes.send + j] = PatternByte(seed + 2, j);
      }
      for (std::size_t j = 0; j < sizes.read; ++j) {
        s.out->data()[sizes.send + sizes.write + j] = PatternByte(seed + 3, j);
      }
      s.in = std::make_unique<Buffer>(FinalOffset() + kFinal + kSlack, 0);
      s.out_key = s.out->Register(s.node->memory(), s.node->pd, kAllRemote);
      s.in_key = s.in->Register(s.node->memory(), s.node->pd, kAllRemote);
      for (std::size_t j = 0; j < kFinal; ++j) s.final_octets[j] = static_cast<std::uint8_t>(0xF0 + 4 * i + j);
    }
  }

  void Post() {
    for (Side& s : sides_) {
      ReceiveWorkRequest r1;
      r1.wr_id = 101;
      AddSplitSges(r1, s.in->addr(), sizes_.send + kSlack, s.in_key, 2);
      ASSERT_EQ(s.node->qp->PostRecv(r1), PostStatus::kOk);
      ReceiveWorkRequest r2;
      r2.wr_id = 102;
      AddSge(r2, s.in->addr() + FinalOffset(), kFinal + kSlack, s.in_key);
      ASSERT_EQ(s.node->qp->PostRecv(r2), PostStatus::kOk);
    }
    for (std::size_t i = 0; i < 2; ++i) {
      Side& s = sides_[i];
      const Side& peer = sides_[1 - i];
      std::vector<SendWorkRequest> wrs;
      SendWorkRequest send = MakeSend(1, SendOpcode::kSend);
      AddSplitSges(send, s.out->addr(), sizes_.send, s.out_key, 3);
      wrs.push_back(send);
      SendWorkRequest write = MakeSend(2, SendOpcode::kRdmaWrite);
      AddSplitSges(write, s.out->addr() + sizes_.send, sizes_.write, s.out_key, 2);
      write.rkey = peer.in_key;
      write.remote_addr = peer.in->addr() + WriteOffset();
      wrs.push_back(write);
      SendWorkRequest read = MakeSend(3, SendOpcode::kRdmaRead);
      AddSge(read, s.in->addr() + ReadOffset(), static_cast<std::uint32_t>(sizes_.read), s.in_key);
      read.rkey = peer.out_key;
      read.remote_addr = peer.out->addr() + sizes_.send + sizes_.write;
      wrs.push_back(read);
      SendWorkRequest final = MakeSend(4, SendOpcode::kSend);
      const std::array<ByteSpan, 1> pieces{ByteSpan(s.final_octets)};
      ASSERT_TRUE(final.CopyInline(pieces));
      wrs.push_back(final);
      std::size_t posted = 0;
      ASSERT_EQ(s.node->qp->PostSend(wrs, &posted), PostStatus::kOk);
      ASSERT_EQ(posted, 4u);
    }
  }

  void WaitAndVerify(std::chrono::milliseconds timeout = kWait) {
    for (std::size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE(i == 0 ? "side a" : "side b");
      Side& s = sides_[i];
      const Side& peer = sides_[1 - i];
      const std::uint32_t qp = s.node->qp->qp_num();
      const auto sc = WaitCompletions(*s.node->send_cq, 4, timeout);
      ASSERT_EQ(sc.size(), 4u);
      const std::array<std::pair<WcOpcode, std::size_t>, 4> want{
          std::pair{WcOpcode::kSend, sizes_.send}, std::pair{WcOpcode::kRdmaWrite, sizes_.write},
          std::pair{WcOpcode::kRdmaRead, sizes_.read}, std::pair{WcOpcode::kSend, kFinal}};
      for (std::size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(sc[k].wr_id, k + 1);
        EXPECT_EQ(sc[k].status, WcStatus::kSuccess) << WcStatusName(sc[k].status);
        EXPECT_EQ(sc[k].opcode, want[k].first);
        EXPECT_EQ(sc[k].byte_len, want[k].second);
        EXPECT_EQ(sc[k].qp_num, qp);
        EXPECT_EQ(sc[k].wc_flags, 0u);
      }
      const auto rc = WaitCompletions(*s.node->recv_cq, 2, timeout);
      ASSERT_EQ(rc.size(), 2u);
      EXPECT_EQ(rc[0].wr_id, 101u);
      EXPECT_EQ(rc[0].byte_len, sizes_.send);
      EXPECT_EQ(rc[1].wr_id, 102u);
      EXPECT_EQ(rc[1].byte_len, kFinal);
      for (const WorkCompletion& wc : rc) {
        EXPECT_EQ(wc.status, WcStatus::kSuccess) << WcStatusName(wc.status);
        EXPECT_EQ(wc.opcode, WcOpcode::kRecv);
        EXPECT_EQ(wc.qp_num, qp);
        EXPECT_EQ(wc.wc_flags, 0u);
      }
      const std::uint8_t* in = s.in->data();
      EXPECT_TRUE(SameBytes(in, peer.out->data(), sizes_.send)) << "Send";
      for (std::size_t j = sizes_.send; j < WriteOffset(); ++j) ASSERT_EQ(in[j], 0) << j;
      EXPECT_TRUE(SameBytes(in + WriteOffset(), peer.out->data() + sizes_.send, sizes_.write)) << "Write";
      EXPECT_TRUE(SameBytes(in + ReadOffset(), peer.out->data() + sizes_.send + sizes_.write,
                            sizes_.read))
          << "Read";
      EXPECT_TRUE(SameBytes(in + FinalOffset(), peer.final_octets.data(), kFinal)) << "final Send";
      for (std::size_t j = FinalOffset() + kFinal; j < s.in->size(); ++j) ASSERT_EQ(in[j], 0) << j;
      EXPECT_TRUE(s.in->GuardsIntact());
      EXPECT_TRUE(s.out->GuardsIntact());
      EXPECT_EQ(s.node->qp->state(), QpState::kRts);
      const QpAttributes attr = s.node->qp->Query();
      EXPECT_FALSE(attr.terminate_sent.has_value());
      EXPECT_FALSE(attr.terminate_received.has_value());
      EXPECT_FALSE(attr.local_error.has_value());
      EXPECT_TRUE(s.node->events.Events().empty());
    }
  }

 private:
  struct Side {
    Node* node = nullptr;
    std::unique_ptr<Buffer> out;  // Send source, Write source, the peer's Read source
    std::unique_ptr<Buffer> in;   // receive, Write sink, Read sink, final receive
    std::uint32_t out_key = 0;
    std::uint32_t in_key = 0;
    std::array<std::uint8_t, kFinal> final_octets{};
  };
  std::size_t WriteOffset() const { return sizes_.send + kSlack; }
  std::size_t ReadOffset() const { return WriteOffset() + sizes_.write; }
  std::size_t FinalOffset() const { return ReadOffset() + sizes_.read; }

  ExchangeSizes sizes_;
  std::array<Side, 2> sides_;
};

// Every octet one end wrote was read by the other, in both directions.
void ExpectBalanced(const Node& a, const Node& b) {
  const QpCounters ca = a.qp->Counters();
  const QpCounters cb = b.qp->Counters();
  EXPECT_EQ(ca.tx_octets, cb.rx_octets);
  EXPECT_EQ(cb.tx_octets, ca.rx_octets);
  EXPECT_EQ(ca.tx_fpdus, cb.rx_fpdus);
  EXPECT_EQ(cb.tx_fpdus, ca.rx_fpdus);
}

std::string FlagsName(bool crc, bool markers) {
  return std::string(crc ? "Crc" : "NoCrc") + (markers ? "_Markers" : "_NoMarkers");
}

// ---- Short writes ----

class ShortWriteTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ShortWriteTest, LargeMessagesSurviveConstantPartialWrites) {
  Watchdog watchdog(kTestLimit, "ShortWriteTest");
  const std::size_t fds_before = OpenFdCount();
  const auto [crc, markers] = GetParam();
  {
    Node a, b;
    const std::array<int, 2> fds = Connect(Transport::kTcp);
    // Both ends send (Read Responses go b -> a): tiny send buffers and small
    // receive buffers everywhere, set before Bind. Linux doubles the values.
    for (int fd : fds) {
      EXPECT_EQ(SetBuffer(fd, SO_SNDBUF, 4096), 8192);
      EXPECT_EQ(SetBuffer(fd, SO_RCVBUF, 32768), 65536);
    }
    LinkOptions o;
    o.crc = crc;
    o.markers = markers;
    a.Bind(fds[0], ParamsFor(o));
    b.Bind(fds[1], ParamsFor(o));
    const ExchangeSizes sizes{(1u << 20) + 13, (2u << 20) + 7, (1u << 20) + 5};
    Exchange exchange(a, b, sizes);
    exchange.Post();
    exchange.WaitAndVerify();
    ExpectBalanced(a, b);
    // The socket was full time and again: each sendmsg took a few dozen KiB
    // at most (a 64 KiB receive buffer), far less than the batch of framed
    // FPDUs it offered, so nearly every call was partial or found no room.
    const QpCounters ca = a.qp->Counters();
    const QpCounters cb = b.qp->Counters();
    const std::uint64_t a_payload = sizes.send + sizes.write + Exchange::kFinal;
    const std::uint64_t b_payload = sizes.send + sizes.write + sizes.read + Exchange::kFinal;
    EXPECT_GE(ca.tx_would_block, a_payload / (128 * 1024)) << ca.tx_syscalls << " sendmsg calls";
    EXPECT_GE(cb.tx_would_block, b_payload / (128 * 1024)) << cb.tx_syscalls << " sendmsg calls";
    EXPECT_GE(ca.tx_syscalls, a_payload / (128 * 1024));
    EXPECT_GE(cb.tx_syscalls, b_payload / (128 * 1024));
    std::printf("[ short    ] sendmsg calls that moved data / found the socket full: a %llu / %llu, "
                "b %llu / %llu\n",
                static_cast<unsigned long long>(ca.tx_syscalls),
                static_cast<unsigned long long>(ca.tx_would_block),
                static_cast<unsigned long long>(cb.tx_syscalls),
                static_cast<unsigned long long>(cb.tx_would_block));
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

std::string ShortWriteName(const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
  return FlagsName(std::get<0>(info.param), std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(CrcAndMarkers, ShortWriteTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()), ShortWriteName);

// ---- Segmentation by a relay ----

struct SegmentationCase {
  Relay::Pace pace;
  bool crc;
  bool markers;
};

std::string SegmentationName(const ::testing::TestParamInfo<SegmentationCase>& info) {
  return std::string(info.param.pace == Relay::Pace::kOctetLockstep ? "OctetByOctet" : "RandomChunks") +
         "_" + FlagsName(info.param.crc, info.param.markers);
}

class SegmentationTest : public ::testing::TestWithParam<SegmentationCase> {};

TEST_P(SegmentationTest, DataAndCompletionsDoNotDependOnHowTheStreamIsCut) {
  const SegmentationCase c = GetParam();
  const std::uint64_t seed = 0x5E6'0000 + (c.crc ? 2 : 0) + (c.markers ? 1 : 0);
  SCOPED_TRACE("relay seed " + std::to_string(seed));
  Watchdog watchdog(kTestLimit, "SegmentationTest seed " + std::to_string(seed));
  const std::size_t fds_before = OpenFdCount();
  const bool octets = c.pace == Relay::Pace::kOctetLockstep;
  {
    Relay::Options ro;
    ro.pace = c.pace;
    ro.seed = seed;
    ro.legs = octets ? Transport::kSocketPair : Transport::kTcp;
    ro.max_chunk = 3000;
    ro.max_delay_us = 150;
    Relay relay(ro);
    Node a, b;
    LinkOptions o;
    o.crc = c.crc;
    o.markers = c.markers;
    // Small FPDUs: many headers, CRCs and markers to cut through.
    o.max_ulpdu = octets ? 128 : 1021;
    a.Bind(relay.TakeQpFd(Relay::kLegA), ParamsFor(o));
    b.Bind(relay.TakeQpFd(Relay::kLegB), ParamsFor(o));
    const ExchangeSizes sizes = octets ? ExchangeSizes{1500, 1999, 1201}
                                       : ExchangeSizes{(256u << 10) + 3, (384u << 10) + 1, (128u << 10) + 7};
    Exchange exchange(a, b, sizes);
    exchange.Post();
    exchange.WaitAndVerify(std::chrono::seconds(60));
    ExpectBalanced(a, b);
    // The relay forwarded every octet each side wrote. It counts an octet
    // after writing it, so the peer may complete on it before the count
    // moves: wait for the count.
    const QpCounters ca = a.qp->Counters();
    const QpCounters cb = b.qp->Counters();
    WaitUntil([&] {
      return relay.counts(Relay::kAtoB).forwarded == ca.tx_octets &&
             relay.counts(Relay::kBtoA).forwarded == cb.tx_octets;
    });
    EXPECT_EQ(relay.counts(Relay::kAtoB).forwarded, ca.tx_octets);
    EXPECT_EQ(relay.counts(Relay::kBtoA).forwarded, cb.tx_octets);
    if (octets) {
      // Lockstep: the next octet is written once the previous one was read,
      // so most recvmsg calls return one octet. A recvmsg still inside the
      // kernel when the next octet lands picks it up too, which a loaded
      // TSan run does often (seen: under 90% single octets), so this only
      // checks that the stream really was cut finely.
      EXPECT_GE(ca.rx_syscalls * 2, ca.rx_octets) << ca.rx_syscalls << " reads";
      EXPECT_GE(cb.rx_syscalls * 2, cb.rx_octets) << cb.rx_syscalls << " reads";
    }
    // What a sent is exactly its four messages, the Read Response for b and
    // nothing else (no Terminate).
    const std::vector<std::uint8_t> a_wire = relay.Record(Relay::kAtoB);
    const ParsedWire parsed = ParseWire(a_wire, c.crc, c.markers);
    EXPECT_EQ(parsed.error, mpa::MpaError::kNone);
    EXPECT_EQ(parsed.consumed, a_wire.size());
    EXPECT_EQ(parsed.segments.size(), ca.tx_fpdus);
    std::size_t terminates = 0, last_segments = 0;
    for (const WireSegment& seg : parsed.segments) {
      terminates += IsTerminate(seg);
      last_segments += seg.decoded.status == rdmap::HeaderStatus::kOk && seg.decoded.header.last;
    }
    EXPECT_EQ(terminates, 0u);
    EXPECT_EQ(last_segments, 5u);  // Send, Write, Read Request, Read Response, final Send
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

INSTANTIATE_TEST_SUITE_P(
    Paces, SegmentationTest,
    ::testing::Values(SegmentationCase{Relay::Pace::kOctetLockstep, false, false},
                      SegmentationCase{Relay::Pace::kOctetLockstep, true, false},
                      SegmentationCase{Relay::Pace::kOctetLockstep, false, true},
                      SegmentationCase{Relay::Pace::kOctetLockstep, true, true},
                      SegmentationCase{Relay::Pace::kRandomChunks, false, false},
                      SegmentationCase{Relay::Pace::kRandomChunks, true, false},
                      SegmentationCase{Relay::Pace::kRandomChunks, false, true},
                      SegmentationCase{Relay::Pace::kRandomChunks, true, true}),
    SegmentationName);

// ---- FIN and RST in the middle of a large message ----

// Payload octets of a message cut after `n` of its wire octets, when every
// FPDU carries `max_ulpdu` octets with a `header`-octet DDP/RDMAP header
// and no markers (RFC 5044 4.1: length, ULPDU, pad, CRC).
std::size_t PayloadWithin(std::uint64_t n, std::size_t max_ulpdu, std::size_t header) {
  const std::size_t fpdu = mpa::UnmarkedFpduLength(max_ulpdu);
  const std::size_t per = max_ulpdu - header;
  const std::size_t rest = static_cast<std::size_t>(n % fpdu);
  const std::size_t lead = mpa::kUlpduLengthSize + header;
  return static_cast<std::size_t>(n / fpdu) * per + std::min(per, rest > lead ? rest - lead : 0);
}

// Whether `got` is `want` for its first k octets and `fill` after them, for
// some k <= max_k (a prefix placed, nothing else touched).
bool PrefixThenFill(const std::uint8_t* got, const std::uint8_t* want, std::size_t size,
                    std::uint8_t fill, std::size_t max_k) {
  std::size_t low = 0;  // first octet that is not the pattern
  while (low < size && got[low] == want[low]) ++low;
  std::size_t high = size;  // one past the last octet that is not the fill
  while (high > 0 && got[high - 1] == fill) --high;
  return high <= low && high <= max_k;
}

// The survivor's own stream as the relay read it: every FPDU parsed.
ParsedWire SurvivorWire(const Relay& relay, bool crc) {
  const std::vector<std::uint8_t> wire = relay.Record(Relay::kBtoA);
  ParsedWire parsed = ParseWire(wire, crc, false);
  EXPECT_EQ(parsed.error, mpa::MpaError::kNone);
  EXPECT_EQ(parsed.consumed, wire.size()) << "the survivor's stream ends inside an FPDU";
  return parsed;
}

enum class Where : std::uint8_t {
  kSurvivorReceivesSend,      // a Sends to b; the cut is inside the Send
  kSurvivorSendsWrite,        // b Writes to a; the cut is inside the Write
  kSurvivorReceivesResponse,  // b Reads from a; the cut is inside a's Read Response
  kSurvivorSendsResponse,     // a Reads from b; the cut is inside b's Read Response
};

struct CutCase {
  Where where;
  Relay::CutKind kind;  // kFin or kRst
};

std::string CutName(const ::testing::TestParamInfo<CutCase>& info) {
  const char* where = "";
  switch (info.param.where) {
    case Where::kSurvivorReceivesSend:
      where = "SurvivorReceivesSend";
      break;
    case Where::kSurvivorSendsWrite:
      where = "SurvivorSendsWrite";
      break;
    case Where::kSurvivorReceivesResponse:
      where = "SurvivorReceivesReadResponse";
      break;
    case Where::kSurvivorSendsResponse:
      where = "SurvivorSendsReadResponse";
      break;
  }
  return std::string(where) + (info.param.kind == Relay::CutKind::kFin ? "_PeerFin" : "_PeerRst");
}

// QP b survives; its peer is the relay, which after `after` octets of the
// large message closes b's leg (FIN, then still reads what b sends) or
// resets it. QP a, on the other leg, is reset in both cases.
class PeerCutTest : public ::testing::TestWithParam<CutCase> {
 protected:
  static constexpr std::size_t kMessage = 1u << 20;
  static constexpr std::size_t kMaxUlpdu = 4096;
  static constexpr std::uint8_t kFill = 0x6B;
};

TEST_P(PeerCutTest, SurvivorFlushesEverythingAndSendsNothingMore) {
  const CutCase c = GetParam();
  const bool fin = c.kind == Relay::CutKind::kFin;
  const bool survivor_sends =
      c.where == Where::kSurvivorSendsWrite || c.where == Where::kSurvivorSendsResponse;
  Watchdog watchdog(kTestLimit, "PeerCutTest");
  const std::size_t fds_before = OpenFdCount();
  {
    Relay::Options ro;
    Relay::Cut cut;
    cut.kind = c.kind;
    cut.survivor = Relay::kLegB;
    if (survivor_sends) {
      // b's octets leave slowly (tiny buffers on b and the relay), so the
      // cut finds most of the message still unsent.
      cut.dir = Relay::kBtoA;
      cut.after = (256u << 10) + 77;
      ro.relay_rcvbuf = 32768;
    } else {
      cut.dir = Relay::kAtoB;
      cut.after = (512u << 10) + 1001;
    }
    ro.cut = cut;
    Relay relay(ro);
    Node a, b;
    LinkOptions o;
    o.crc = true;
    o.max_ulpdu = kMaxUlpdu;
    const int b_fd = relay.TakeQpFd(Relay::kLegB);
    if (survivor_sends) {
      EXPECT_EQ(SetBuffer(b_fd, SO_SNDBUF, 4096), 8192);
    }
    a.Bind(relay.TakeQpFd(Relay::kLegA), ParamsFor(o));
    b.Bind(b_fd, ParamsFor(o));

    Buffer a_mem(kMessage, kFill), b_mem(kMessage, kFill);
    std::vector<std::uint8_t> pattern(kMessage);
    for (std::size_t j = 0; j < kMessage; ++j) pattern[j] = PatternByte(77, j);
    Buffer b_small(16, 0);
    const std::uint32_t a_key = a_mem.Register(a.memory(), a.pd, kAllRemote);
    const std::uint32_t b_key = b_mem.Register(b.memory(), b.pd, kAllRemote);
    const std::uint32_t b_small_key = b_small.Register(b.memory(), b.pd, kAllRemote);
    std::size_t a_posted = 0;  // a's signaled WRs
    std::size_t b_recvs = 0;   // b's receive WRs, wr_ids 11, 12, ...
    std::vector<std::uint64_t> b_wrs;
    auto post_b_recv = [&](std::uint64_t length) {
      ReceiveWorkRequest r;
      r.wr_id = 11 + b_recvs++;
      AddSge(r, length > 16 ? b_mem.addr() : b_small.addr(), static_cast<std::uint32_t>(length),
             length > 16 ? b_key : b_small_key);
      ASSERT_EQ(b.qp->PostRecv(r), PostStatus::kOk);
    };
    switch (c.where) {
      case Where::kSurvivorReceivesSend: {
        std::memcpy(a_mem.data(), pattern.data(), kMessage);
        post_b_recv(kMessage);
        post_b_recv(16);
        SendWorkRequest send = MakeSend(1, SendOpcode::kSend);
        AddSge(send, a_mem.addr(), kMessage, a_key);
        ASSERT_EQ(a.qp->PostSend(send), PostStatus::kOk);
        a_posted = 1;
        break;
      }
      case Where::kSurvivorSendsWrite: {
        std::memcpy(b_mem.data(), pattern.data(), kMessage);
        post_b_recv(16);
        SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
        AddSge(write, b_mem.addr(), kMessage, b_key);
        write.rkey = a_key;
        write.remote_addr = a_mem.addr();
        SendWorkRequest read = MakeSend(2, SendOpcode::kRdmaRead);
        AddSge(read, b_small.addr(), 16, b_small_key);
        read.rkey = a_key;
        read.remote_addr = a_mem.addr();
        const std::array<SendWorkRequest, 2> wrs{write, read};
        std::size_t posted = 0;
        ASSERT_EQ(b.qp->PostSend(wrs, &posted), PostStatus::kOk);
        b_wrs = {1, 2};
        break;
      }
      case Where::kSurvivorReceivesResponse: {
        std::memcpy(a_mem.data(), pattern.data(), kMessage);
        post_b_recv(16);
        SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
        AddSge(read, b_mem.addr(), kMessage, b_key);
        read.rkey = a_key;
        read.remote_addr = a_mem.addr();
        ASSERT_EQ(b.qp->PostSend(read), PostStatus::kOk);
        b_wrs = {1};
        break;
      }
      case Where::kSurvivorSendsResponse: {
        std::memcpy(b_mem.data(), pattern.data(), kMessage);
        post_b_recv(16);
        SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
        AddSge(read, a_mem.addr(), kMessage, a_key);
        read.rkey = b_key;
        read.remote_addr = b_mem.addr();
        ASSERT_EQ(a.qp->PostSend(read), PostStatus::kOk);
        a_posted = 1;
        break;
      }
    }

    // The survivor ends in ERR with every WR completed, in order.
    ASSERT_TRUE(WaitUntil([&] { return b.qp->state() == QpState::kError; }))
        << "b is in state " << static_cast<int>(b.qp->state());
    const auto b_recv = WaitCompletions(*b.recv_cq, b_recvs);
    ASSERT_EQ(b_recv.size(), b_recvs);
    for (std::size_t i = 0; i < b_recvs; ++i) {
      EXPECT_EQ(b_recv[i].wr_id, 11 + i);
      EXPECT_EQ(b_recv[i].status, WcStatus::kWrFlushErr) << WcStatusName(b_recv[i].status);
      EXPECT_EQ(b_recv[i].opcode, WcOpcode::kRecv);
      EXPECT_EQ(b_recv[i].qp_num, b.qp->qp_num());
    }
    const auto b_send = WaitCompletions(*b.send_cq, b_wrs.size());
    ASSERT_EQ(b_send.size(), b_wrs.size());
    for (std::size_t i = 0; i < b_wrs.size(); ++i) {
      EXPECT_EQ(b_send[i].wr_id, b_wrs[i]);
      // Only a Write that a peer's FIN let b finish succeeds; a Read never
      // gets its response once the peer is gone.
      const bool done = fin && c.where == Where::kSurvivorSendsWrite && i == 0;
      EXPECT_EQ(b_send[i].status, done ? WcStatus::kSuccess : WcStatus::kWrFlushErr)
          << WcStatusName(b_send[i].status);
      EXPECT_EQ(b_send[i].byte_len, done ? kMessage : 0u);
    }
    EXPECT_TRUE(StaysEmpty(*b.send_cq, std::chrono::milliseconds(20)));
    EXPECT_EQ(b.recv_cq->size(), 0u);

    // What b did about it, and everything it put on the wire.
    const QpAttributes attr = b.qp->Query();
    EXPECT_FALSE(attr.terminate_received.has_value());
    EXPECT_EQ(attr.sq_outstanding, 0u);
    const QpCounters counters = b.qp->Counters();
    if (!fin) {
      // RST: the stream is gone; no Terminate can be sent (RFC 5044 8: the
      // LLP is lost), the cause is recorded locally.
      EXPECT_TRUE(b.events.WaitFor(AsyncEventType::kQpFatal));
      EXPECT_FALSE(attr.terminate_sent.has_value());
      ASSERT_TRUE(attr.local_error.has_value());
      EXPECT_EQ(*attr.local_error, TerminateCause::MpaConnectionLost());
    } else if (!survivor_sends) {
      // FIN inside a message the survivor receives: the LLP closed inside a
      // message (RFC 5044 8, code 1); b says so in a Terminate, then FIN.
      EXPECT_TRUE(b.events.WaitFor(AsyncEventType::kQpFatal));
      ASSERT_TRUE(attr.terminate_sent.has_value());
      EXPECT_EQ(attr.terminate_sent->cause, TerminateCause::MpaConnectionLost());
      EXPECT_FALSE(attr.local_error.has_value());
    } else {
      // FIN while b sends: an orderly close at a message boundary of b's
      // receive side. b finishes what was posted and owed, then FIN.
      EXPECT_TRUE(b.events.WaitFor(AsyncEventType::kStreamClosed));
      EXPECT_FALSE(b.events.Has(AsyncEventType::kQpFatal));
      EXPECT_FALSE(attr.terminate_sent.has_value());
      EXPECT_FALSE(attr.local_error.has_value());
    }

    if (fin) {
      // b closed its side after what it had to send: the relay saw its FIN.
      ASSERT_TRUE(relay.WaitFor(Relay::kBtoA, [](const Relay::Counts& n) { return n.source_closed; }));
      const ParsedWire wire = SurvivorWire(relay, true);
      EXPECT_EQ(wire.segments.size(), counters.tx_fpdus);
      // The messages b sent (one opcode per message: its segments are
      // contiguous and the last one has L set), and their payload.
      std::vector<rdmap::Opcode> opcodes;
      std::size_t payload = 0;
      bool inside = false;
      for (const WireSegment& seg : wire.segments) {
        ASSERT_EQ(seg.decoded.status, rdmap::HeaderStatus::kOk);
        if (inside) {
          EXPECT_EQ(seg.decoded.header.opcode, opcodes.back());
        } else {
          opcodes.push_back(seg.decoded.header.opcode);
        }
        inside = !seg.decoded.header.last;
        payload += seg.payload.size();
      }
      EXPECT_FALSE(inside) << "b's stream ends inside a message";
      switch (c.where) {
        case Where::kSurvivorReceivesSend:
          ASSERT_EQ(wire.segments.size(), 1u);
          EXPECT_EQ(DecodeTerminateSegment(wire.segments[0])->cause, TerminateCause::MpaConnectionLost());
          break;
        case Where::kSurvivorSendsWrite:
          EXPECT_EQ(opcodes, (std::vector<rdmap::Opcode>{rdmap::Opcode::kRdmaWrite,
                                                         rdmap::Opcode::kRdmaReadRequest}));
          EXPECT_EQ(payload, kMessage);
          break;
        case Where::kSurvivorReceivesResponse:
          ASSERT_EQ(wire.segments.size(), 2u);
          EXPECT_EQ(wire.segments[0].decoded.header.opcode, rdmap::Opcode::kRdmaReadRequest);
          EXPECT_EQ(DecodeTerminateSegment(wire.segments[1])->cause, TerminateCause::MpaConnectionLost());
          break;
        case Where::kSurvivorSendsResponse:
          EXPECT_EQ(opcodes, std::vector<rdmap::Opcode>{rdmap::Opcode::kRdmaReadResponse});
          EXPECT_EQ(payload, kMessage);
          EXPECT_TRUE(wire.segments.back().decoded.header.last);
          break;
      }
    } else {
      // After a reset b wrote nothing but what preceded the cut.
      const std::uint64_t before = c.where == Where::kSurvivorReceivesResponse ? 1 : 0;
      if (!survivor_sends) {
        EXPECT_EQ(counters.tx_fpdus, before);
      }
    }

    // Placement at the survivor: what arrived before the cut, nothing else.
    if (c.where == Where::kSurvivorReceivesSend || c.where == Where::kSurvivorReceivesResponse) {
      const std::size_t header = c.where == Where::kSurvivorReceivesSend ? rdmap::kDdpUntaggedHeaderSize
                                                                         : rdmap::kDdpTaggedHeaderSize;
      const std::size_t k = PayloadWithin(cut.after, kMaxUlpdu, header);
      ASSERT_LT(k, kMessage);
      if (fin) {
        // Everything before the FIN was read and placed.
        EXPECT_TRUE(SameBytes(b_mem.data(), pattern.data(), k));
        for (std::size_t j = k; j < kMessage; ++j) ASSERT_EQ(b_mem.data()[j], kFill) << j;
      } else {
        // A reset may overtake octets in flight: a prefix, nothing beyond.
        EXPECT_TRUE(PrefixThenFill(b_mem.data(), pattern.data(), kMessage, kFill, k));
      }
      EXPECT_TRUE(b_mem.GuardsIntact());
    }

    // a was reset: it fails too, and accounts for its WR.
    EXPECT_TRUE(a.events.WaitFor(AsyncEventType::kQpFatal));
    EXPECT_TRUE(WaitUntil([&] { return a.qp->state() == QpState::kError; }));
    const auto a_send = WaitCompletions(*a.send_cq, a_posted);
    ASSERT_EQ(a_send.size(), a_posted);
    if (a_posted == 1) {
      EXPECT_EQ(a_send[0].wr_id, 1u);
      if (c.where == Where::kSurvivorSendsResponse) {
        EXPECT_EQ(a_send[0].status, WcStatus::kWrFlushErr);  // a quarter of the response came
      } else {
        EXPECT_TRUE(a_send[0].status == WcStatus::kSuccess || a_send[0].status == WcStatus::kWrFlushErr)
            << WcStatusName(a_send[0].status);
      }
    }
    ASSERT_TRUE(a.qp->Query().local_error.has_value());
    EXPECT_EQ(*a.qp->Query().local_error, TerminateCause::MpaConnectionLost());
    EXPECT_TRUE(StaysEmpty(*a.send_cq, std::chrono::milliseconds(5)));
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

INSTANTIATE_TEST_SUITE_P(
    Cuts, PeerCutTest,
    ::testing::Values(CutCase{Where::kSurvivorReceivesSend, Relay::CutKind::kFin},
                      CutCase{Where::kSurvivorReceivesSend, Relay::CutKind::kRst},
                      CutCase{Where::kSurvivorSendsWrite, Relay::CutKind::kFin},
                      CutCase{Where::kSurvivorSendsWrite, Relay::CutKind::kRst},
                      CutCase{Where::kSurvivorReceivesResponse, Relay::CutKind::kFin},
                      CutCase{Where::kSurvivorReceivesResponse, Relay::CutKind::kRst},
                      CutCase{Where::kSurvivorSendsResponse, Relay::CutKind::kFin},
                      CutCase{Where::kSurvivorSendsResponse, Relay::CutKind::kRst}),
    CutName);

// ---- Corruption and truncation ----

// Where each FPDU of a stream starts, for messages of `payloads[i]` octets
// cut into segments of at most `max_ulpdu - headers[i]` payload octets
// (RFC 5044 4.1, 4.3: markers every 512 octets of the stream, one due at an
// FPDU's first octet belongs to it). The last entry is the stream's end.
std::vector<std::size_t> FpduStarts(const std::vector<std::pair<std::size_t, std::size_t>>& messages,
                                    std::size_t max_ulpdu, bool markers) {
  std::vector<std::size_t> starts{0};
  for (const auto& [payload, header] : messages) {
    std::size_t left = payload;
    do {
      const std::size_t n = std::min(left, max_ulpdu - header);
      const std::size_t at = starts.back();
      starts.push_back(at + mpa::FpduWireLength(header + n, markers,
                                                static_cast<std::uint32_t>(at % mpa::kMarkerInterval)));
      left -= n;
    } while (left > 0);
  }
  return starts;
}

enum class Damage : std::uint8_t {
  kPayloadOctet,  // one payload octet of FPDU kVictim
  kStagOctet,     // the low octet of FPDU kVictim's STag (RFC 5041 4.2)
  kDdpVersion,    // DV of FPDU kVictim's DDP control octet (RFC 5041 4.1)
  kMsnOctet,      // the low octet of FPDU kVictim's MSN (RFC 5041 4.3)
  kMarker,        // the FPDUPTR of the marker at stream octet 5 * 512 (RFC 5044 4.3)
  kTruncate,      // FIN 300 octets into FPDU kVictim
};

struct DamageCase {
  const char* name;
  bool crc;
  bool markers;
  bool send;  // the damaged message is a Send (else an RDMA Write)
  Damage damage;
  TerminateCause cause;   // what b's Terminate says
  bool header_copy;       // with M, D and the DDP header copy (RFC 5040 4.8)
  AsyncEventType event;   // b's async event
  bool victim_placed;     // the damaged FPDU's payload is placed (before its CRC is checked)
};

std::string DamageName(const ::testing::TestParamInfo<DamageCase>& info) { return info.param.name; }

class DamageTest : public ::testing::TestWithParam<DamageCase> {
 protected:
  static constexpr std::size_t kMaxUlpdu = 1024;
  static constexpr std::size_t kVictim = 5;  // FPDU index within the message
  static constexpr std::size_t kFpdus = 13;
  static constexpr std::uint8_t kFill = 0x3C;
};

// a's message is held by the relay until a has completed it (TCP took all
// of it) and posted a Read behind it; then the relay lets it through with
// one octet damaged, or cut. b must stop at exactly that FPDU, send the
// Terminate the damage calls for (and nothing else), and a must take it:
// the completed message stays successful, the Read is flushed.
TEST_P(DamageTest, ReceiverTerminatesAtTheDamagedFpdu) {
  const DamageCase c = GetParam();
  Watchdog watchdog(kTestLimit, std::string("DamageTest ") + c.name);
  const std::size_t fds_before = OpenFdCount();
  const std::size_t header = c.send ? rdmap::kDdpUntaggedHeaderSize : rdmap::kDdpTaggedHeaderSize;
  const std::size_t per = kMaxUlpdu - header;
  const std::size_t size = (kFpdus - 1) * per + 500;
  const std::size_t read_request = rdmap::kDdpUntaggedHeaderSize + rdmap::kReadRequestBodySize;
  const std::vector<std::size_t> starts =
      FpduStarts({{size, header}, {0, read_request}}, kMaxUlpdu, c.markers);
  ASSERT_EQ(starts.size(), kFpdus + 2);
  const std::size_t victim = starts[kVictim];
  // The victim FPDU is the one holding the damaged octet.
  std::size_t damaged_fpdu = kVictim;
  {
    Relay::Options ro;
    ro.hold[Relay::kAtoB] = true;
    std::uint64_t at = 0;
    std::uint8_t mask = 0;
    switch (c.damage) {
      case Damage::kPayloadOctet:
        at = victim + mpa::kUlpduLengthSize + header + 100;
        mask = 0x01;
        break;
      case Damage::kStagOctet:
        at = victim + mpa::kUlpduLengthSize + 5;
        mask = 0x01;
        break;
      case Damage::kDdpVersion:
        at = victim + mpa::kUlpduLengthSize;
        mask = 0x03;  // DV 1 -> 2
        break;
      case Damage::kMsnOctet:
        at = victim + mpa::kUlpduLengthSize + 13;
        mask = 0x04;  // MSN 1 -> 5
        break;
      case Damage::kMarker:
        at = 5 * mpa::kMarkerInterval + 3;
        mask = 0x04;
        while (starts[damaged_fpdu + 1] <= at) ++damaged_fpdu;
        while (starts[damaged_fpdu] > at) --damaged_fpdu;
        break;
      case Damage::kTruncate:
        break;
    }
    // A damaged header field must not sit under a marker (the marker's
    // octets are not the header's).
    if (c.markers && c.damage != Damage::kMarker && c.damage != Damage::kTruncate) {
      ASSERT_NE(victim % mpa::kMarkerInterval, 0u);
      ASSERT_EQ(victim / mpa::kMarkerInterval,
                (victim + mpa::kUlpduLengthSize + header) / mpa::kMarkerInterval);
    }
    if (c.damage == Damage::kTruncate) {
      ro.cut = Relay::Cut{Relay::kAtoB, victim + 300, Relay::CutKind::kTruncate, Relay::kLegB};
    } else {
      ro.corrupt_dir = Relay::kAtoB;
      ro.corrupt_at = at;
      ro.corrupt_xor = mask;
    }
    Relay relay(ro);
    Node a, b;
    LinkOptions o;
    o.crc = c.crc;
    o.markers = c.markers;
    o.max_ulpdu = kMaxUlpdu;
    a.Bind(relay.TakeQpFd(Relay::kLegA), ParamsFor(o));
    b.Bind(relay.TakeQpFd(Relay::kLegB), ParamsFor(o));

    Buffer src(size), sink(size, kFill), small(64);
    src.Fill(91);
    const std::uint32_t src_key = src.Register(a.memory(), a.pd, kAllRemote);
    const std::uint32_t small_key = small.Register(a.memory(), a.pd, kAllRemote);
    const std::uint32_t sink_key = sink.Register(b.memory(), b.pd, kAllRemote);
    for (std::uint64_t id = 11; id <= 12; ++id) {
      ReceiveWorkRequest r;
      r.wr_id = id;
      AddSge(r, sink.addr(), static_cast<std::uint32_t>(size), sink_key);
      ASSERT_EQ(b.qp->PostRecv(r), PostStatus::kOk);
    }
    SendWorkRequest message = MakeSend(1, c.send ? SendOpcode::kSend : SendOpcode::kRdmaWrite);
    AddSplitSges(message, src.addr(), size, src_key, 2);
    message.rkey = sink_key;
    message.remote_addr = sink.addr();
    ASSERT_EQ(a.qp->PostSend(message), PostStatus::kOk);
    const auto first = WaitCompletions(*a.send_cq, 1);
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].wr_id, 1u);
    EXPECT_EQ(first[0].status, WcStatus::kSuccess);
    EXPECT_EQ(first[0].byte_len, size);
    SendWorkRequest read = MakeSend(2, SendOpcode::kRdmaRead);
    AddSge(read, small.addr(), 64, small_key);
    read.rkey = sink_key;  // never served: b stops before it
    read.remote_addr = sink.addr();
    ASSERT_EQ(a.qp->PostSend(read), PostStatus::kOk);
    // The layout computed above is what a wrote.
    ASSERT_TRUE(relay.WaitFor(Relay::kAtoB, [&](const Relay::Counts& n) { return n.read >= starts.back(); }));
    ASSERT_EQ(relay.counts(Relay::kAtoB).read, starts.back());
    const std::vector<std::uint8_t> sent = relay.Record(Relay::kAtoB);
    relay.Release(Relay::kAtoB);

    // b: the Terminate, the event, the flushes.
    ASSERT_TRUE(WaitUntil([&] { return b.qp->state() == QpState::kError; }));
    EXPECT_TRUE(b.events.WaitFor(c.event));
    const QpAttributes battr = b.qp->Query();
    ASSERT_TRUE(battr.terminate_sent.has_value());
    const rdmap::TerminateHeader& t = *battr.terminate_sent;
    EXPECT_EQ(t.cause, c.cause) << int{t.cause.layer} << "/" << int{t.cause.etype} << "/"
                                << int{t.cause.ecode};
    EXPECT_EQ(t.m, c.header_copy);
    EXPECT_EQ(t.d, c.header_copy);
    EXPECT_FALSE(t.r);
    if (c.header_copy) {
      // The copy is of the header as b received it: damaged.
      std::vector<std::uint8_t> want(sent.begin() + static_cast<std::ptrdiff_t>(victim + mpa::kUlpduLengthSize),
                                     sent.begin() + static_cast<std::ptrdiff_t>(victim + mpa::kUlpduLengthSize + header));
      want[at - victim - mpa::kUlpduLengthSize] ^= mask;
      EXPECT_EQ(std::vector<std::uint8_t>(t.DdpHeaderCopy().begin(), t.DdpHeaderCopy().end()), want);
      EXPECT_EQ(t.ddp_segment_length, kMaxUlpdu);
    }
    EXPECT_FALSE(battr.local_error.has_value());
    const auto brc = WaitCompletions(*b.recv_cq, 2);
    ASSERT_EQ(brc.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(brc[i].wr_id, 11 + i);
      EXPECT_EQ(brc[i].status, WcStatus::kWrFlushErr) << WcStatusName(brc[i].status);
    }
    // b sent the Terminate and nothing else, then FIN.
    ASSERT_TRUE(relay.WaitFor(Relay::kBtoA, [](const Relay::Counts& n) { return n.source_closed; }));
    const ParsedWire b_wire = ParseWire(relay.Record(Relay::kBtoA), c.crc, c.markers);
    EXPECT_EQ(b_wire.error, mpa::MpaError::kNone);
    ASSERT_EQ(b_wire.segments.size(), 1u);
    const std::optional<rdmap::TerminateHeader> on_wire = DecodeTerminateSegment(b_wire.segments[0]);
    ASSERT_TRUE(on_wire.has_value());
    EXPECT_EQ(on_wire->cause, c.cause);
    EXPECT_EQ(b.qp->Counters().tx_fpdus, 1u);

    // Placement: the FPDUs before the damaged one, that one only if its
    // header was sound (placed before its CRC or marker is checked), and
    // nothing after it.
    std::size_t placed = damaged_fpdu * per;
    if (c.victim_placed) placed += per;
    if (c.damage == Damage::kTruncate) placed += 300 - mpa::kUlpduLengthSize - header;
    ASSERT_LE(placed, size);
    std::vector<std::uint8_t> want(src.data(), src.data() + placed);
    if (c.damage == Damage::kPayloadOctet) want[kVictim * per + 100] ^= mask;
    EXPECT_TRUE(SameBytes(sink.data(), want.data(), placed));
    for (std::size_t j = placed; j < size; ++j) ASSERT_EQ(sink.data()[j], kFill) << j;
    EXPECT_TRUE(sink.GuardsIntact());

    // a: the peer's Terminate; the message it had completed stays
    // completed, the Read is flushed; a answers with FIN only.
    EXPECT_TRUE(a.events.WaitFor(AsyncEventType::kQpFatal));
    ASSERT_TRUE(WaitUntil([&] { return a.qp->state() == QpState::kError; }));
    const QpAttributes aattr = a.qp->Query();
    ASSERT_TRUE(aattr.terminate_received.has_value());
    EXPECT_EQ(aattr.terminate_received->cause, c.cause);
    EXPECT_FALSE(aattr.terminate_sent.has_value());
    const auto asc = WaitCompletions(*a.send_cq, 1);
    ASSERT_EQ(asc.size(), 1u);
    EXPECT_EQ(asc[0].wr_id, 2u);
    EXPECT_EQ(asc[0].status, WcStatus::kWrFlushErr) << WcStatusName(asc[0].status);
    EXPECT_EQ(asc[0].opcode, WcOpcode::kRdmaRead);
    ASSERT_TRUE(relay.WaitFor(Relay::kAtoB, [](const Relay::Counts& n) { return n.source_closed; }));
    EXPECT_EQ(relay.counts(Relay::kAtoB).read, starts.back());
    EXPECT_EQ(a.qp->Counters().tx_fpdus, kFpdus + 1);
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

INSTANTIATE_TEST_SUITE_P(
    Damage, DamageTest,
    ::testing::Values(
        // CRC on: any damaged octet is an LLP CRC error (RFC 5044 8), even in
        // a header that would itself be refused (a CRC error takes precedence).
        DamageCase{"CrcPayloadOctet", true, false, false, Damage::kPayloadOctet,
                   TerminateCause::MpaCrcMismatch(), false, AsyncEventType::kQpFatal, true},
        DamageCase{"CrcStagOctet", true, false, false, Damage::kStagOctet,
                   TerminateCause::MpaCrcMismatch(), false, AsyncEventType::kQpFatal, false},
        DamageCase{"CrcMsnOctetOfASend", true, true, true, Damage::kMsnOctet,
                   TerminateCause::MpaCrcMismatch(), false, AsyncEventType::kQpFatal, false},
        // CRC off: the damaged field decides (RFC 5041 7.2, RFC 5044 8).
        DamageCase{"NoCrcStagOctet", false, false, false, Damage::kStagOctet,
                   TerminateCause::DdpInvalidStag(), true, AsyncEventType::kQpAccessError, false},
        DamageCase{"NoCrcDdpVersion", false, false, false, Damage::kDdpVersion,
                   TerminateCause::DdpTaggedInvalidVersion(), false, AsyncEventType::kQpAccessError,
                   false},
        DamageCase{"NoCrcMsnOctetOfASend", false, false, true, Damage::kMsnOctet,
                   TerminateCause::DdpInvalidMsnRange(), true, AsyncEventType::kQpRequestError, false},
        DamageCase{"NoCrcMarker", false, true, false, Damage::kMarker,
                   TerminateCause::MpaMarkerMismatch(), false, AsyncEventType::kQpFatal, true},
        // A stream that ends inside an FPDU: the LLP closed (RFC 5044 8).
        DamageCase{"TruncatedInsideAnFpdu", true, false, false, Damage::kTruncate,
                   TerminateCause::MpaConnectionLost(), false, AsyncEventType::kQpFatal, false},
        DamageCase{"TruncatedInsideASendWithMarkers", false, true, true, Damage::kTruncate,
                   TerminateCause::MpaConnectionLost(), false, AsyncEventType::kQpFatal, false}),
    DamageName);

// ---- Destroying a QP or an engine under traffic ----

// One QP's share of continuous traffic to its peer: a window of Writes,
// Reads and Sends (Sends only within the peer's posted receives), receives
// kept posted, every completion kept in order.
struct Lane {
  static constexpr std::size_t kWrite = 256 * 1024;
  static constexpr std::size_t kRead = 64 * 1024;
  static constexpr std::size_t kSend = 4 * 1024;
  static constexpr std::size_t kRegion = kWrite + kRead + kSend;
  static constexpr std::size_t kWindow = 16;   // outstanding send WRs
  static constexpr std::size_t kRecvs = 32;    // outstanding receives

  Lane(Node& n, std::uint32_t seed) : node(&n), src(kRegion), dst(kRegion, 0) {
    src.Fill(seed);
    src_key = RegisterRegion(src);
    dst_key = RegisterRegion(dst);
  }
  std::uint32_t RegisterRegion(Buffer& b) {
    // Registered in the table directly: a test that destroys the engine
    // must not deregister afterwards (Buffer::Register would).
    const RegisterResult r = node->memory().Register(node->pd, b.addr(), b.size(),
                                                     reinterpret_cast<std::uintptr_t>(b.data()), kAllRemote);
    EXPECT_EQ(r.status, RegisterStatus::kOk);
    return r.stag;
  }
  void Deregister() {
    node->memory().Deregister(src_key);
    node->memory().Deregister(dst_key);
  }

  // One turn of the driving thread: top up, post, poll. False when nothing moved.
  bool Turn() {
    bool progress = false;
    std::array<WorkCompletion, 16> batch;
    for (std::size_t n; (n = node->send_cq->Poll(batch)) > 0; progress = true) {
      send_done.insert(send_done.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
    }
    for (std::size_t n; (n = node->recv_cq->Poll(batch)) > 0; progress = true) {
      recv_done.insert(recv_done.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (posting && !failed()) {
      while (recvs_posted - recv_done.size() < kRecvs) {
        ReceiveWorkRequest r;
        r.wr_id = recvs_posted;
        AddSge(r, dst.addr() + kWrite + kRead, kSend, dst_key);
        if (node->qp->PostRecv(r) != PostStatus::kOk) break;
        recvs_posted_shared.store(++recvs_posted);
        progress = true;
      }
      while (sends_posted - send_done.size() < kWindow) {
        SendWorkRequest wr;
        const std::uint64_t id = sends_posted;
        if (id % 3 == 2 && sends_issued < peer->recvs_posted_shared.load()) {
          wr = MakeSend(id, SendOpcode::kSend);
          AddSge(wr, src.addr() + kWrite + kRead, kSend, src_key);
          ++sends_issued;
        } else if (id % 3 == 1) {
          wr = MakeSend(id, SendOpcode::kRdmaRead);
          AddSge(wr, dst.addr() + kWrite, kRead, dst_key);
          wr.rkey = peer->src_key;
          wr.remote_addr = peer->src.addr() + kWrite;
        } else {
          wr = MakeSend(id, SendOpcode::kRdmaWrite);
          AddSge(wr, src.addr(), kWrite, src_key);
          wr.rkey = peer->dst_key;
          wr.remote_addr = peer->dst.addr();
        }
        const PostStatus st = node->qp->PostSend(wr);
        if (st != PostStatus::kOk) {
          post_refused = st;
          break;
        }
        ++sends_posted;
        progress = true;
      }
    }
    return progress;
  }
  // A WR of this lane completed in error: stop adding work.
  bool failed() const {
    return !send_done.empty() && send_done.back().status != WcStatus::kSuccess;
  }
  // Every send WR completed, and every receive too once the QP failed (a
  // live QP keeps its spare receives posted).
  bool drained() const {
    return send_done.size() == sends_posted &&
           (recv_done.size() == recvs_posted || node->qp->state() != QpState::kError);
  }

  Node* node;
  Lane* peer = nullptr;
  Buffer src, dst;
  std::uint32_t src_key = 0, dst_key = 0;
  bool posting = true;
  std::uint64_t sends_posted = 0;   // wr_ids 0 .. sends_posted - 1
  std::uint64_t sends_issued = 0;   // of them Sends
  std::uint64_t recvs_posted = 0;   // wr_ids 0 .. recvs_posted - 1
  std::atomic<std::uint64_t> recvs_posted_shared{0};  // read by the peer's thread
  std::optional<PostStatus> post_refused;
  std::vector<WorkCompletion> send_done, recv_done;
};

// Completions in WR order, every WR once: wr_ids 0, 1, 2, ...; successes,
// then (if the stream broke) only WrFlushErr. Returns how many were flushed.
std::size_t ExpectAccounted(const std::vector<WorkCompletion>& done, std::uint64_t posted,
                            std::uint32_t qp_num, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(done.size(), posted);
  std::size_t flushed = 0;
  for (std::size_t i = 0; i < done.size(); ++i) {
    const bool in_flush = flushed > 0 || done[i].status != WcStatus::kSuccess;
    // Report the first wrong completion only (the rest follow from it).
    if (done[i].wr_id != i || done[i].qp_num != qp_num ||
        (in_flush && done[i].status != WcStatus::kWrFlushErr)) {
      ADD_FAILURE() << "completion " << i << " of " << done.size() << ": wr_id " << done[i].wr_id
                    << " qp " << done[i].qp_num << " status " << WcStatusName(done[i].status)
                    << " (after " << flushed << " flushed)";
      return flushed;
    }
    if (in_flush) ++flushed;
  }
  return flushed;
}

// `lanes` driven by one thread until `stop`, then (with `drain`) polled
// until every WR completed (bounded).
void Drive(std::vector<Lane*> lanes, const std::atomic<bool>& stop,
           const std::function<bool(const Lane&)>& skip, bool drain) {
  while (!stop.load()) {
    bool progress = false;
    for (Lane* l : lanes) {
      if (!skip(*l)) progress |= l->Turn();
    }
    if (!progress) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (Lane* l : lanes) l->posting = false;
  if (!drain) return;
  const auto deadline = Clock::now() + kWait;
  for (bool all = false; !all && Clock::now() < deadline;) {
    all = true;
    for (Lane* l : lanes) {
      if (skip(*l)) continue;
      l->Turn();
      all &= l->drained();
    }
    if (!all) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Once the driving threads are done: waits (bounded) until the receive
// completions of every Send the peer completed have arrived (a Send
// completes at its sender when TCP took it, before the receiver placed it).
void CollectReceives(Lane& l) {
  std::array<WorkCompletion, 16> batch;
  WaitUntil([&] {
    for (std::size_t n; (n = l.node->recv_cq->Poll(batch)) > 0;) {
      l.recv_done.insert(l.recv_done.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
    }
    return l.recv_done.size() >= l.peer->sends_issued;
  });
}

constexpr std::size_t kDestroyPairs = 4;

// Pairs a[i] <-> b[i] over loopback TCP; side a on one engine, b on another.
struct Pairs {
  Pairs() {
    NodeOptions options;
    options.sq_caps = QueueCaps{64, 2, 0};
    options.rq_caps = QueueCaps{64, 1, 0};
    options.cq_depth = 256;
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      a.push_back(std::make_unique<Node>(options, p == 0 ? nullptr : a[0]->engine));
      b.push_back(std::make_unique<Node>(options, p == 0 ? nullptr : b[0]->engine));
      LinkOptions o;
      o.crc = p % 2 == 0;
      o.markers = p == 1;
      o.ird = o.ord = 4;
      Link(*a[p], *b[p], Transport::kTcp, o);
    }
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      la.push_back(std::make_unique<Lane>(*a[p], static_cast<std::uint32_t>(100 + p)));
      lb.push_back(std::make_unique<Lane>(*b[p], static_cast<std::uint32_t>(200 + p)));
      la[p]->peer = lb[p].get();
      lb[p]->peer = la[p].get();
    }
  }
  ~Pairs() {
    // Teardown order the engine needs: regions of live engines first, then
    // nodes sharing an engine, then the owners.
    for (auto* side : {&la, &lb}) {
      for (auto& l : *side) {
        if (l->node->engine != nullptr && l->node->qp != nullptr) l->Deregister();
      }
    }
    la.clear();
    lb.clear();
    for (std::size_t p = kDestroyPairs; p-- > 0;) {
      a[p].reset();
      b[p].reset();
    }
  }
  std::vector<Lane*> Side(std::vector<std::unique_ptr<Lane>>& lanes) {
    std::vector<Lane*> out;
    for (auto& l : lanes) out.push_back(l.get());
    return out;
  }
  std::vector<std::unique_ptr<Node>> a, b;
  std::vector<std::unique_ptr<Lane>> la, lb;
};

// The data of a lane whose traffic all succeeded: every Write, Read and
// Send target holds the peer's source octets. The peer issues a Send only
// when one of our receives is posted, so a lane starved of CPU (a loaded
// sanitizer run) may see none: then the Send target stays untouched.
void ExpectLaneData(const Lane& l) {
  const std::size_t tagged = Lane::kWrite + Lane::kRead;
  const bool sent = l.peer->sends_issued > 0;
  EXPECT_TRUE(SameBytes(l.dst.data(), l.peer->src.data(), sent ? Lane::kRegion : tagged))
      << l.peer->sends_issued << " Sends issued by the peer, " << l.peer->sends_posted
      << " WRs posted";
  if (!sent) {
    const std::vector<std::uint8_t> zeros(Lane::kSend, 0);
    EXPECT_TRUE(SameBytes(l.dst.data() + tagged, zeros.data(), Lane::kSend));
  }
  EXPECT_TRUE(l.dst.GuardsIntact());
}

// How a peer's QP ends when the QP it is connected to is destroyed
// mid-traffic. The destroy closes the stream as Linux siw does (FIN after
// what TCP holds, an FPDU partly out finished first), so the peer sees one
// of three ends: the FIN at a message boundary (orderly: no error, only
// the stream-closed event), the FIN inside a Send or Read Response (RFC
// 5044 8: a Terminate for the lost connection, the fatal event), or an RST
// when the destroyed side could not read away what the peer kept sending.
// `events`: those of the peer's engine. Returns which end, for the log.
const char* ExpectEndedByPeerDestroy(Node& n, const std::vector<AsyncEvent>& events) {
  const QpAttributes attr = n.qp->Query();
  std::vector<AsyncEventType> mine;
  for (const AsyncEvent& e : events) {
    if (e.qp_num == n.qp->qp_num()) mine.push_back(e.type);
  }
  EXPECT_EQ(attr.state, QpState::kError);
  EXPECT_FALSE(attr.terminate_received.has_value());
  const std::vector<AsyncEventType> fatal{AsyncEventType::kQpFatal, AsyncEventType::kStreamClosed};
  if (attr.local_error) {
    EXPECT_EQ(*attr.local_error, TerminateCause::MpaConnectionLost());
    EXPECT_FALSE(attr.terminate_sent.has_value());
    EXPECT_EQ(mine, fatal);
    return "RST";
  }
  if (attr.terminate_sent) {
    EXPECT_EQ(attr.terminate_sent->cause, TerminateCause::MpaConnectionLost());
    EXPECT_EQ(mine, fatal);
    return "FIN inside a message";
  }
  EXPECT_EQ(mine, std::vector<AsyncEventType>{AsyncEventType::kStreamClosed});
  return "FIN";
}

TEST(EngineDestroy, DestroyOneQpWhileTrafficIsInFlight) {
  Watchdog watchdog(kTestLimit, "DestroyOneQpWhileTrafficIsInFlight");
  const std::size_t fds_before = OpenFdCount();
  {
    Pairs pairs;
    std::atomic<bool> stop{false};
    std::atomic<bool> victim_gone{false};
    auto skip_victim = [&](const Lane& l) { return &l == pairs.la[0].get() && victim_gone.load(); };
    std::thread ta(Drive, pairs.Side(pairs.la), std::cref(stop), skip_victim, true);
    std::thread tb(Drive, pairs.Side(pairs.lb), std::cref(stop), [](const Lane&) { return false; },
                   true);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));

    // a[0] goes away mid-traffic; its driver stops touching it first, so
    // what its CQs hold after Destroy returns is final.
    victim_gone.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::uint32_t victim_num = pairs.a[0]->qp->qp_num();
    pairs.a[0]->qp->Destroy();
    EXPECT_EQ(pairs.a[0]->engine->FindQp(victim_num), nullptr);
    EXPECT_EQ(pairs.a[0]->qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kInvalidState);
    EXPECT_EQ(pairs.a[0]->qp->PostRecv(ReceiveWorkRequest{}), PostStatus::kInvalidState);
    const std::size_t victim_send = pairs.a[0]->send_cq->size();
    const std::size_t victim_recv = pairs.a[0]->recv_cq->size();
    // Its peer learns from the stream's end; the other pairs carry on.
    EXPECT_TRUE(WaitUntil([&] { return pairs.b[0]->qp->state() == QpState::kError; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    stop.store(true);
    ta.join();
    tb.join();

    // No completion for the destroyed QP after Destroy returned.
    EXPECT_EQ(pairs.a[0]->send_cq->size(), victim_send);
    EXPECT_EQ(pairs.a[0]->recv_cq->size(), victim_recv);
    const Lane& va = *pairs.la[0];
    for (std::size_t i = 0; i < va.send_done.size(); ++i) {
      EXPECT_EQ(va.send_done[i].wr_id, i);
      EXPECT_EQ(va.send_done[i].status, WcStatus::kSuccess);
    }
    // The peer: ended by the destroy, everything flushed in order.
    const Lane& vb = *pairs.lb[0];
    const std::vector<AsyncEvent> b_events = pairs.b[0]->events.Events();
    std::printf("the peer of the destroyed QP saw: %s\n",
                ExpectEndedByPeerDestroy(*pairs.b[0], b_events));
    // b[0] posts until it sees a failed completion, so at least one of its
    // send WRs is flushed; its spare receives may all have been consumed.
    EXPECT_GE(ExpectAccounted(vb.send_done, vb.sends_posted, pairs.b[0]->qp->qp_num(), "b[0] sends"), 1u);
    ExpectAccounted(vb.recv_done, vb.recvs_posted, pairs.b[0]->qp->qp_num(), "b[0] receives");
    // Nothing for any other QP.
    for (const AsyncEvent& e : b_events) EXPECT_EQ(e.qp_num, pairs.b[0]->qp->qp_num());
    EXPECT_TRUE(pairs.a[0]->events.Events().empty());

    // The others: every WR succeeded, every octet arrived.
    for (std::size_t p = 1; p < kDestroyPairs; ++p) {
      SCOPED_TRACE("pair " + std::to_string(p));
      for (Lane* l : {pairs.la[p].get(), pairs.lb[p].get()}) {
        CollectReceives(*l);
        EXPECT_GT(l->sends_posted, 0u);
        EXPECT_EQ(ExpectAccounted(l->send_done, l->sends_posted, l->node->qp->qp_num(), "sends"), 0u);
        // Every Send the peer posted consumed one receive, in order.
        EXPECT_EQ(l->recv_done.size(), l->peer->sends_issued);
        EXPECT_EQ(ExpectAccounted(l->recv_done, l->peer->sends_issued, l->node->qp->qp_num(), "receives"),
                  0u);
        EXPECT_EQ(l->node->qp->state(), QpState::kRts);
        ExpectLaneData(*l);
      }
    }
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

TEST(EngineDestroy, DestroyAnEngineWhileTrafficIsInFlight) {
  Watchdog watchdog(kTestLimit, "DestroyAnEngineWhileTrafficIsInFlight");
  const std::size_t fds_before = OpenFdCount();
  {
    Pairs pairs;
    std::atomic<bool> stop_a{false}, stop_b{false};
    auto never = [](const Lane&) { return false; };
    std::thread ta(Drive, pairs.Side(pairs.la), std::cref(stop_a), never, false);
    std::thread tb(Drive, pairs.Side(pairs.lb), std::cref(stop_b), never, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    // Side a's application stops (an engine must outlive every use of its
    // QPs) with its windows full; side b keeps posting Reads from a and
    // Writes to a while the engine goes away.
    stop_a.store(true);
    ta.join();
    // A starved test thread may find a's windows drained by now: fill each
    // SQ with 256 KiB Writes (up to 16 MiB per QP, far more than the
    // sockets hold), so the engine goes with WRs in flight.
    for (auto& l : pairs.la) {
      for (std::uint64_t i = 0; i < 64; ++i) {
        SendWorkRequest wr = MakeSend((1u << 20) + i, SendOpcode::kRdmaWrite);
        AddSge(wr, l->src.addr(), Lane::kWrite, l->src_key);
        wr.rkey = l->peer->dst_key;
        wr.remote_addr = l->peer->dst.addr();
        if (l->node->qp->PostSend(wr) != PostStatus::kOk) break;
      }
    }
    std::array<std::size_t, kDestroyPairs> a_send{}, a_recv{};
    std::size_t a_outstanding = 0;
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      a_outstanding += pairs.a[p]->qp->Query().sq_outstanding;
    }
    EXPECT_GT(a_outstanding, 0u);  // in flight when the engine goes
    const auto t0 = Clock::now();
    pairs.a[0]->own_engine.reset();
    const auto took = Clock::now() - t0;
    EXPECT_LT(took, std::chrono::seconds(5));
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      // The engine destroyed its QPs; the handles must not call into it.
      pairs.a[p]->qp.reset();
      pairs.a[p]->engine = nullptr;
      a_send[p] = pairs.a[p]->send_cq->size();
      a_recv[p] = pairs.a[p]->recv_cq->size();
    }
    // Every QP of b ends and flushes.
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      EXPECT_TRUE(WaitUntil([&] { return pairs.b[p]->qp->state() == QpState::kError; })) << p;
    }
    stop_b.store(true);
    tb.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // Per QP of b: one of the ends of a peer's destroy.
    const std::vector<AsyncEvent> events = pairs.b[0]->events.Events();
    for (std::size_t p = 0; p < kDestroyPairs; ++p) {
      SCOPED_TRACE("pair " + std::to_string(p));
      const Lane& l = *pairs.lb[p];
      std::printf("pair %zu: %s\n", p, ExpectEndedByPeerDestroy(*l.node, events));
      // Every posted send is accounted for; how many of them succeeded before
      // a's engine went depends on scheduling (none, on a loaded machine).
      ExpectAccounted(l.send_done, l.sends_posted, l.node->qp->qp_num(), "sends");
      ExpectAccounted(l.recv_done, l.recvs_posted, l.node->qp->qp_num(), "receives");
      // Nothing reached a's CQs after its engine was gone.
      EXPECT_EQ(pairs.a[p]->send_cq->size(), a_send[p]);
      EXPECT_EQ(pairs.a[p]->recv_cq->size(), a_recv[p]);
    }
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

}  // namespace
}  // namespace siwx::engine::testing
