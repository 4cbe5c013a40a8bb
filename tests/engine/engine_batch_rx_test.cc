// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The receive side parses many FPDUs out of one large read (rx.h,
// Placement): small payloads are copied out of the staging buffer, large
// ones placed straight into their targets. These tests write a whole wire
// image into the socket before the QP is bound, so the engine's first read
// sees all of it at once: FPDUs are cut by the end of the staging buffer
// (QpRx::kStagingSize) at every position of their framing, and errors
// arrive in the middle of a batch, where the FPDUs before them must complete
// and nothing after them may be placed (RFC 5044 8: after an error MPA
// passes nothing more on; RFC 5040 7.1: the Terminate ends the stream).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using rdmap::TerminateCause;
using Bytes = std::vector<std::uint8_t>;

// A QP whose peer wrote a wire image before the QP was bound to the stream.
class PrewrittenLink {
 public:
  PrewrittenLink(Node& node, const LinkOptions& o) : node_(node), options_(o) {
    fds_ = Connect(Transport::kSocketPair);
    // Room for the whole image before anything reads it.
    const int size = 1 << 20;
    setsockopt(fds_[1], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    peer_ = std::make_unique<RawPeer>(fds_[1], o.crc, o.markers);
  }
  RawPeer& peer() { return *peer_; }
  // Writes `wire` and then binds the QP to the other end.
  void WriteThenBind(const Bytes& wire) {
    peer_->WriteAll(wire);
    node_.Bind(fds_[0], ParamsFor(options_));
  }

 private:
  Node& node_;
  LinkOptions options_;
  std::array<int, 2> fds_{};
  std::unique_ptr<RawPeer> peer_;
};

Bytes Pattern(std::uint32_t seed, std::size_t size) {
  Bytes b(size);
  for (std::size_t i = 0; i < size; ++i) b[i] = PatternByte(seed, i);
  return b;
}

// Appends a framed ULPDU that is not a DDP/RDMAP header + payload pair (the
// Terminate message).
void FrameUlpduTo(RawPeer& peer, ByteSpan ulpdu, Bytes& out) {
  mpa::FpduFrame frame;
  ASSERT_EQ(peer.framer().Frame(ulpdu, {}, frame), mpa::FrameStatus::kOk);
  for (const mpa::IoSlice& s : frame.slices()) out.insert(out.end(), s.base, s.base + s.len);
}

struct BatchConfig {
  bool crc;
  bool markers;
};

std::string BatchName(const ::testing::TestParamInfo<BatchConfig>& info) {
  return std::string(info.param.crc ? "Crc" : "NoCrc") +
         (info.param.markers ? "_Markers" : "_NoMarkers");
}

class BatchRxTest : public ::testing::TestWithParam<BatchConfig> {
 protected:
  LinkOptions Options() const {
    LinkOptions o;
    o.crc = GetParam().crc;
    o.markers = GetParam().markers;
    return o;
  }
};

// Many MTU-sized and smaller FPDUs (Writes and Sends) in one image larger
// than the staging buffer; a filler FPDU of `shift` octets in front moves
// the staging buffer's end across every octet of the FPDU it cuts (length
// field, header, payload, pad, CRC, markers). Every octet lands where it
// belongs, every Send completes in order, and the reads are few.
TEST_P(BatchRxTest, FpdusCutByTheStagingBufferEndAtEveryPosition) {
  constexpr std::size_t kFpdus = 120;
  for (std::size_t shift = 0; shift < 48; ++shift) {
    SCOPED_TRACE("shift " + std::to_string(shift));
    Node node;
    PrewrittenLink link(node, Options());
    Buffer target(kFpdus * 1400, 0);
    const std::uint32_t rkey = target.Register(node.memory(), node.pd, kAllRemote, true);
    Buffer recv(64 * 256, 0);
    const std::uint32_t lkey =
        recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite, true);

    Bytes wire;
    Bytes expected(target.size(), 0);
    std::vector<Bytes> sends;
    RawPeer& peer = link.peer();
    const Bytes filler = Pattern(99, shift + 1);
    peer.FrameTo(WriteHeader(rkey, target.addr() + target.size() - filler.size()), filler, wire);
    std::copy(filler.begin(), filler.end(),
              expected.end() - static_cast<std::ptrdiff_t>(filler.size()));
    std::size_t at = 0;
    for (std::size_t i = 0; i < kFpdus; ++i) {
      if (i % 5 == 4) {
        const Bytes msg = Pattern(static_cast<std::uint32_t>(i), 1 + i % 64);
        peer.FrameTo(SendHeaderOf(static_cast<std::uint32_t>(sends.size() + 1), 0), msg, wire);
        sends.push_back(msg);
        continue;
      }
      // Up to the payload of a standard Ethernet FPDU (MULPDU 1424 - 14).
      const std::size_t size = 1 + (i * 397) % 1410;
      const Bytes payload = Pattern(static_cast<std::uint32_t>(1000 + i), size);
      peer.FrameTo(WriteHeader(rkey, target.addr() + at), payload, wire);
      std::copy(payload.begin(), payload.end(), expected.begin() + static_cast<std::ptrdiff_t>(at));
      at += size;
    }
    ASSERT_LT(at + filler.size(), target.size());
    ASSERT_GT(wire.size(), QpRx::kStagingSize + 64);
    for (std::size_t k = 0; k < sends.size(); ++k) {
      ReceiveWorkRequest rwr;
      rwr.wr_id = 100 + k;
      AddSge(rwr, recv.addr() + 64 * k, 64, lkey);
      ASSERT_EQ(node.qp->PostRecv(rwr), PostStatus::kOk);
    }
    link.WriteThenBind(wire);

    const auto wc = WaitCompletions(*node.recv_cq, sends.size());
    ASSERT_EQ(wc.size(), sends.size());
    for (std::size_t k = 0; k < sends.size(); ++k) {
      EXPECT_EQ(wc[k].wr_id, 100 + k);
      EXPECT_EQ(wc[k].status, WcStatus::kSuccess);
      EXPECT_EQ(wc[k].byte_len, sends[k].size());
      EXPECT_TRUE(SameBytes(recv.data() + 64 * k, sends[k].data(), sends[k].size()));
    }
    // The last Send came after every Write (RFC 5040 5.5: placed before it
    // is delivered).
    EXPECT_TRUE(SameBytes(target.data(), expected.data(), expected.size()));
    EXPECT_TRUE(target.GuardsIntact());
    EXPECT_TRUE(recv.GuardsIntact());
    const QpCounters c = node.qp->Counters();
    EXPECT_EQ(c.rx_fpdus, kFpdus + 1);
    EXPECT_EQ(c.rx_octets, wire.size());
    // All of it was waiting: a few reads of the staging buffer's size, not
    // one per FPDU.
    EXPECT_LE(c.rx_syscalls, wire.size() / QpRx::kStagingSize + 2);
    EXPECT_EQ(c.rx_direct_payload, 0u);
    EXPECT_EQ(node.qp->state(), QpState::kRts);
  }
}

// Small FPDUs, then a Write whose payload the staging buffer's end cuts with
// more than QpRx::kDirectPlacementMin octets left (received straight into
// the target), small ones again, a large one again, and a Send last.
TEST_P(BatchRxTest, SmallAndLargePayloadsMixed) {
  Node node;
  PrewrittenLink link(node, Options());
  constexpr std::size_t kLarge = 60000;
  Buffer target(4 * kLarge, 0);
  const std::uint32_t rkey = target.Register(node.memory(), node.pd, kAllRemote, true);
  Buffer recv(64, 0);
  const std::uint32_t lkey = recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite, true);
  PostRecv(node, 7, recv, lkey);

  Bytes wire;
  Bytes expected(target.size(), 0);
  RawPeer& peer = link.peer();
  std::size_t at = 0;
  auto write = [&](std::size_t size, std::uint32_t seed) {
    const Bytes payload = Pattern(seed, size);
    peer.FrameTo(WriteHeader(rkey, target.addr() + at), payload, wire);
    std::copy(payload.begin(), payload.end(), expected.begin() + static_cast<std::ptrdiff_t>(at));
    at += size;
  };
  for (std::uint32_t i = 0; wire.size() < QpRx::kStagingSize / 2; ++i) write(1000 + i, i);
  write(kLarge, 500);  // cut by the staging buffer's end, about 30 KiB left
  for (std::uint32_t i = 0; i < 20; ++i) write(100 + 50 * i, 600 + i);
  write(kLarge, 700);
  write(3, 701);
  const Bytes msg = Pattern(800, 33);
  peer.FrameTo(SendHeaderOf(1, 0), msg, wire);
  link.WriteThenBind(wire);

  const auto wc = WaitCompletions(*node.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].byte_len, msg.size());
  EXPECT_TRUE(SameBytes(recv.data(), msg.data(), msg.size()));
  EXPECT_TRUE(SameBytes(target.data(), expected.data(), expected.size()));
  EXPECT_TRUE(target.GuardsIntact());
  const QpCounters c = node.qp->Counters();
  EXPECT_EQ(c.rx_octets, wire.size());
  if (!GetParam().markers) {
    // Markers cut payload into pieces of at most 512 octets, which are
    // always copied.
    EXPECT_GE(c.rx_direct_payload, QpRx::kDirectPlacementMin);
  }
  EXPECT_GT(c.rx_staged_payload, 0u);
  EXPECT_EQ(c.rx_staged_payload + c.rx_direct_payload, at + msg.size());
}

// Large messages at a large MULPDU: large FPDUs, then a small last one.
// Only the first read (the stream starts with framing) goes through the
// staging buffer; after it every large payload is read directly, and the
// direct read of a large FPDU takes the small FPDU that ends its message
// along in its staging tail (rx.h small_follower_octets_), so a message
// costs one recvmsg per large FPDU. The next large FPDU is never pulled
// into the staging buffer and copied, but for the few octets of its
// payload that a tail sized for a small FPDU fetches (rx.h, Placement).
struct LargeMessageShape {
  const char* name;
  std::size_t large_fpdus;  // per message, each of kLarge payload octets
  friend void PrintTo(const LargeMessageShape& shape, std::ostream* os) { *os << shape.name; }
};

class BatchRxLargeTest : public ::testing::TestWithParam<LargeMessageShape> {};

TEST_P(BatchRxLargeTest, LargeFpdusStayPlacedDirectly) {
  Node node;
  PrewrittenLink link(node, LinkOptions{});
  constexpr std::size_t kMessages = 12;
  constexpr std::size_t kLarge = 30000;
  constexpr std::size_t kSmall = 36;
  const std::size_t large_fpdus = GetParam().large_fpdus;
  Buffer target(kMessages * (large_fpdus * kLarge + kSmall), 0);
  const std::uint32_t rkey = target.Register(node.memory(), node.pd, kAllRemote, true);
  Buffer recv(8, 0);
  PostRecv(node, 1, recv, recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite));
  Bytes wire;
  Bytes expected(target.size(), 0);
  std::size_t at = 0;
  std::uint32_t seed = 0;
  for (std::size_t m = 0; m < kMessages; ++m) {
    std::vector<std::size_t> sizes(large_fpdus, kLarge);
    sizes.push_back(kSmall);
    for (const std::size_t size : sizes) {
      const Bytes payload = Pattern(seed++, size);
      link.peer().FrameTo(WriteHeader(rkey, target.addr() + at, size == kSmall), payload, wire);
      std::copy(payload.begin(), payload.end(), expected.begin() + static_cast<std::ptrdiff_t>(at));
      at += size;
    }
  }
  link.peer().FrameTo(SendHeaderOf(1, 0), {}, wire);
  link.WriteThenBind(wire);

  ASSERT_EQ(WaitCompletions(*node.recv_cq, 1).size(), 1u);
  EXPECT_TRUE(SameBytes(target.data(), expected.data(), expected.size()));
  EXPECT_TRUE(target.GuardsIntact());
  const QpCounters c = node.qp->Counters();
  EXPECT_EQ(c.rx_staged_payload + c.rx_direct_payload, at);
  // Copied at most: the first staging buffer's worth, and per large FPDU
  // what its tail fetches past the next header (a small FPDU's length,
  // plus the difference between the longest and the tagged header).
  const std::size_t small_fpdu = mpa::UnmarkedFpduLength(rdmap::kDdpTaggedHeaderSize + kSmall);
  const std::size_t copied_at_most =
      QpRx::kStagingSize + kMessages * large_fpdus * (small_fpdu + 16);
  EXPECT_LE(c.rx_staged_payload, copied_at_most);
  EXPECT_GE(c.rx_direct_payload, at - copied_at_most);
  // One recvmsg per large FPDU (the small one cost one more before).
  EXPECT_LE(c.rx_syscalls, kMessages * large_fpdus + 2);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BatchRxLargeTest,
    ::testing::Values(LargeMessageShape{"OneLargeThenSmall", 1},
                      // 64 KiB Writes on loopback: two 32 KiB FPDUs, then 48 octets.
                      LargeMessageShape{"TwoLargeThenSmall", 2}),
    [](const ::testing::TestParamInfo<LargeMessageShape>& p) { return p.param.name; });

// Sends of many MTU-sized FPDUs (what a standard peer sends for a 16 KiB
// message): the receive buffer is looked up in the memory table once per
// message and read, not twice per FPDU (rx.h pin_; lookups were a quarter
// of the receiving thread's time, docs/performance-notes.md 3.10). Every
// segment is still checked against the region held (RFC 5041 7.1); the
// messages complete in order with their data.
TEST_P(BatchRxTest, SendsOfManyFpdusLookUpTheirBufferOncePerRead) {
  Node node;
  PrewrittenLink link(node, Options());
  constexpr std::size_t kMessages = 6;
  constexpr std::size_t kMessageSize = 16 * 1024;
  constexpr std::size_t kFpduPayload = 1400;
  Buffer recv(kMessages * kMessageSize, 0);
  const std::uint32_t lkey = recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  Bytes wire;
  std::vector<Bytes> messages;
  std::size_t fpdus = 0;
  for (std::size_t m = 0; m < kMessages; ++m) {
    messages.push_back(Pattern(static_cast<std::uint32_t>(m), kMessageSize));
    for (std::size_t mo = 0; mo < kMessageSize; mo += kFpduPayload) {
      const std::size_t n = std::min(kFpduPayload, kMessageSize - mo);
      link.peer().FrameTo(SendHeaderOf(static_cast<std::uint32_t>(m + 1),
                                       static_cast<std::uint32_t>(mo), mo + n == kMessageSize),
                          ByteSpan(messages[m].data() + mo, n), wire);
      ++fpdus;
    }
    ReceiveWorkRequest rwr;
    rwr.wr_id = 10 + m;
    AddSge(rwr, recv.addr() + m * kMessageSize, kMessageSize, lkey);
    ASSERT_EQ(node.qp->PostRecv(rwr), PostStatus::kOk);
  }
  const std::uint64_t checks_before = node.memory().checks();
  link.WriteThenBind(wire);

  const auto wc = WaitCompletions(*node.recv_cq, kMessages);
  ASSERT_EQ(wc.size(), kMessages);
  for (std::size_t m = 0; m < kMessages; ++m) {
    EXPECT_EQ(wc[m].wr_id, 10 + m);
    EXPECT_EQ(wc[m].status, WcStatus::kSuccess);
    EXPECT_EQ(wc[m].byte_len, kMessageSize);
    EXPECT_TRUE(SameBytes(recv.data() + m * kMessageSize, messages[m].data(), kMessageSize)) << m;
  }
  EXPECT_TRUE(recv.GuardsIntact());
  const QpCounters c = node.qp->Counters();
  EXPECT_EQ(c.rx_fpdus, fpdus);
  // One lookup at a message's first FPDU and one after every read that ends
  // inside a message; before the pin it was two per FPDU (at the header and
  // at placement), 2 x 72 here.
  const std::uint64_t checks = node.memory().checks() - checks_before;
  EXPECT_LE(checks, kMessages + c.rx_syscalls) << fpdus << " FPDUs, " << c.rx_syscalls
                                                << " reads";
  // Nothing holds the buffer once the reads are processed (Deregister waits
  // for every holder, memory.h).
  EXPECT_EQ(node.memory().Deregister(lkey), DeregisterStatus::kOk);
}

// Receive WRs whose SGEs alternate between two regions, with FPDUs that
// straddle the SGE boundaries: a piece in the region held for the read and
// one in the other go to the right places, and neither region is held after
// the read.
TEST_P(BatchRxTest, SendsIntoSgesOfTwoRegions) {
  Node node;
  PrewrittenLink link(node, Options());
  constexpr std::size_t kMessages = 4;
  constexpr std::array<std::size_t, 3> kSges{5000, 3001, 8383};  // A, B, A
  constexpr std::size_t kMessageSize = kSges[0] + kSges[1] + kSges[2];
  constexpr std::size_t kFpduPayload = 1400;
  Buffer a(kMessages * (kSges[0] + kSges[2]), 0);
  Buffer b(kMessages * kSges[1], 0);
  const std::uint32_t a_key = a.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  const std::uint32_t b_key = b.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  Bytes wire;
  std::vector<Bytes> messages;
  for (std::size_t m = 0; m < kMessages; ++m) {
    messages.push_back(Pattern(static_cast<std::uint32_t>(40 + m), kMessageSize));
    for (std::size_t mo = 0; mo < kMessageSize; mo += kFpduPayload) {
      const std::size_t n = std::min(kFpduPayload, kMessageSize - mo);
      link.peer().FrameTo(SendHeaderOf(static_cast<std::uint32_t>(m + 1),
                                       static_cast<std::uint32_t>(mo), mo + n == kMessageSize),
                          ByteSpan(messages[m].data() + mo, n), wire);
    }
    ReceiveWorkRequest rwr;
    rwr.wr_id = 20 + m;
    const std::uint64_t a_at = a.addr() + m * (kSges[0] + kSges[2]);
    AddSge(rwr, a_at, kSges[0], a_key);
    AddSge(rwr, b.addr() + m * kSges[1], kSges[1], b_key);
    AddSge(rwr, a_at + kSges[0], kSges[2], a_key);
    ASSERT_EQ(node.qp->PostRecv(rwr), PostStatus::kOk);
  }
  link.WriteThenBind(wire);

  const auto wc = WaitCompletions(*node.recv_cq, kMessages);
  ASSERT_EQ(wc.size(), kMessages);
  for (std::size_t m = 0; m < kMessages; ++m) {
    EXPECT_EQ(wc[m].wr_id, 20 + m);
    EXPECT_EQ(wc[m].status, WcStatus::kSuccess);
    EXPECT_EQ(wc[m].byte_len, kMessageSize);
    const std::uint8_t* want = messages[m].data();
    const std::uint8_t* a_at = a.data() + m * (kSges[0] + kSges[2]);
    EXPECT_TRUE(SameBytes(a_at, want, kSges[0])) << m;
    EXPECT_TRUE(SameBytes(b.data() + m * kSges[1], want + kSges[0], kSges[1])) << m;
    EXPECT_TRUE(SameBytes(a_at + kSges[0], want + kSges[0] + kSges[1], kSges[2])) << m;
  }
  EXPECT_TRUE(a.GuardsIntact());
  EXPECT_TRUE(b.GuardsIntact());
  EXPECT_EQ(node.memory().Deregister(a_key), DeregisterStatus::kOk);
  EXPECT_EQ(node.memory().Deregister(b_key), DeregisterStatus::kOk);
}

INSTANTIATE_TEST_SUITE_P(Framing, BatchRxTest,
                         ::testing::Values(BatchConfig{false, false}, BatchConfig{true, false},
                                           BatchConfig{false, true}, BatchConfig{true, true}),
                         BatchName);

// ---- Errors in the middle of a batch ----

// Five Sends, the bad FPDU, then a Write and two Sends that must not be
// processed. The five complete, the rest are flushed, and the Write after
// the bad FPDU leaves its target untouched.
class BatchErrorTest : public ::testing::Test {
 protected:
  static constexpr std::size_t kBefore = 5;
  static constexpr std::size_t kAfterSends = 2;

  void Build(const LinkOptions& o) {
    link_ = std::make_unique<PrewrittenLink>(node_, o);
    for (std::size_t k = 0; k < kBefore + 1 + kAfterSends; ++k) {
      ReceiveWorkRequest rwr;
      rwr.wr_id = 100 + k;
      AddSge(rwr, recv_.addr() + 64 * k, 64, recv_key_);
      ASSERT_EQ(node_.qp->PostRecv(rwr), PostStatus::kOk);
    }
    for (std::uint32_t k = 0; k < kBefore; ++k) {
      peer().FrameTo(SendHeaderOf(k + 1, 0), Pattern(k, 40), wire_);
    }
  }
  // After the bad FPDU: a Write into `after_` and more Sends.
  void Finish(std::uint32_t next_msn) {
    const Bytes payload = Pattern(77, 300);
    peer().FrameTo(WriteHeader(after_key_, after_.addr()), payload, wire_);
    for (std::uint32_t k = 0; k < kAfterSends; ++k) {
      peer().FrameTo(SendHeaderOf(next_msn + k, 0), Pattern(50 + k, 40), wire_);
    }
    link_->WriteThenBind(wire_);
  }
  // The first `kBefore` receives completed with their data, the rest were
  // flushed, and nothing after the bad FPDU was placed.
  void ExpectBatchCut() {
    const std::size_t total = kBefore + 1 + kAfterSends;
    const auto wc = WaitCompletions(*node_.recv_cq, total);
    ASSERT_EQ(wc.size(), total);
    for (std::size_t k = 0; k < total; ++k) {
      EXPECT_EQ(wc[k].wr_id, 100 + k);
      if (k < kBefore) {
        EXPECT_EQ(wc[k].status, WcStatus::kSuccess) << k;
        EXPECT_EQ(wc[k].byte_len, 40u);
        const Bytes want = Pattern(static_cast<std::uint32_t>(k), 40);
        EXPECT_TRUE(SameBytes(recv_.data() + 64 * k, want.data(), want.size()));
      } else {
        EXPECT_EQ(wc[k].status, WcStatus::kWrFlushErr) << k;
      }
    }
    for (std::size_t k = kBefore + 1; k < total; ++k) {
      for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(recv_.data()[64 * k + i], 0) << k << "/" << i;
    }
    for (std::size_t i = 0; i < after_.size(); ++i) ASSERT_EQ(after_.data()[i], 0) << i;
    EXPECT_TRUE(after_.GuardsIntact());
    EXPECT_TRUE(recv_.GuardsIntact());
    EXPECT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
  }
  RawPeer& peer() { return link_->peer(); }

  Node node_;
  std::unique_ptr<PrewrittenLink> link_;
  Bytes wire_;
  Buffer recv_{64 * (kBefore + 1 + kAfterSends), 0};
  std::uint32_t recv_key_ =
      recv_.Register(node_.memory(), node_.pd, AccessFlags::kLocalWrite, true);
  Buffer after_{300, 0};
  std::uint32_t after_key_ = after_.Register(node_.memory(), node_.pd, kAllRemote, true);
};

// RFC 5044 8: a CRC error ends the stream with an MPA CRC Error Terminate;
// the FPDUs before it were good and complete, none after it is looked at.
TEST_F(BatchErrorTest, CrcErrorInTheMiddleOfABatch) {
  LinkOptions o;
  o.crc = true;
  Build(o);
  const std::size_t bad_at = wire_.size();
  peer().FrameTo(SendHeaderOf(kBefore + 1, 0), Pattern(kBefore, 40), wire_);
  wire_[bad_at + 2 + 18 + 5] ^= 0x01;  // a payload bit of the sixth Send
  Finish(kBefore + 2);
  // The Send whose FPDU failed its CRC is flushed with the rest.
  ExpectBatchCut();
  const std::optional<rdmap::TerminateHeader> t = peer().WaitTerminate();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, TerminateCause::MpaCrcMismatch());
}

// RFC 5041 7.2: a tagged segment naming an STag that does not exist is not
// placed; the Terminate carries its header copy; the stream ends there.
TEST_F(BatchErrorTest, InvalidStagInTheMiddleOfABatch) {
  Build({});
  peer().FrameTo(WriteHeader(after_key_ ^ 0x100, after_.addr()), Pattern(9, 300), wire_);
  Finish(kBefore + 1);
  ExpectBatchCut();
  const std::optional<rdmap::TerminateHeader> t = peer().WaitTerminate();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, TerminateCause::DdpInvalidStag());
}

// RFC 5041 7.1 (and 7.2, "Base or bounds violation"): every tagged segment
// is checked against its own target, also when the FPDUs before it in the
// same read went to the same region (checked once, then held for the read):
// Writes alternating between two regions land in the right one, and a Write
// past the end of the region the read already used is refused.
TEST_F(BatchErrorTest, WritePastTheRegionOfEarlierWritesInTheSameBatch) {
  Build({});
  Buffer first(300, 0);
  Buffer second(300, 0);
  const std::uint32_t first_key = first.Register(node_.memory(), node_.pd, kAllRemote);
  const std::uint32_t second_key = second.Register(node_.memory(), node_.pd, kAllRemote);
  peer().FrameTo(WriteHeader(first_key, first.addr(), false), Pattern(1, 100), wire_);
  peer().FrameTo(WriteHeader(second_key, second.addr() + 100), Pattern(2, 100), wire_);
  peer().FrameTo(WriteHeader(first_key, first.addr() + 100), Pattern(3, 100), wire_);
  // 100 octets from offset 250 of a 300-octet region.
  peer().FrameTo(WriteHeader(first_key, first.addr() + 250), Pattern(4, 100), wire_);
  Finish(kBefore + 1);
  ExpectBatchCut();
  const std::optional<rdmap::TerminateHeader> t = peer().WaitTerminate();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, TerminateCause::DdpBaseOrBounds());
  const Bytes p1 = Pattern(1, 100);
  const Bytes p2 = Pattern(2, 100);
  const Bytes p3 = Pattern(3, 100);
  EXPECT_TRUE(SameBytes(first.data(), p1.data(), p1.size()));
  EXPECT_TRUE(SameBytes(first.data() + 100, p3.data(), p3.size()));
  for (std::size_t i = 200; i < first.size(); ++i) ASSERT_EQ(first.data()[i], 0) << i;
  for (std::size_t i = 0; i < 100; ++i) ASSERT_EQ(second.data()[i], 0) << i;
  EXPECT_TRUE(SameBytes(second.data() + 100, p2.data(), p2.size()));
  EXPECT_TRUE(first.GuardsIntact());
  EXPECT_TRUE(second.GuardsIntact());
  // Nothing holds the regions after the read: deregistering returns (it
  // waits for every holder, memory.h).
  EXPECT_EQ(node_.memory().Deregister(first_key), DeregisterStatus::kOk);
  EXPECT_EQ(node_.memory().Deregister(second_key), DeregisterStatus::kOk);
}

// A stream of Writes that stays open: once the Writes are placed, nothing of
// the receive side holds their region any more, so it can be deregistered
// (Deregister waits for every holder, memory.h) and a later Write to it is
// refused with Invalid STag (RFC 5041 7.2).
TEST(BatchRxPinTest, RegionOfPlacedWritesCanBeDeregistered) {
  Node node;
  PrewrittenLink link(node, LinkOptions{});
  Buffer target(4096, 0);
  const std::uint32_t key = target.Register(node.memory(), node.pd, kAllRemote, true);
  Buffer recv(64, 0);
  PostRecv(node, 1, recv, recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite));
  Bytes wire;
  for (std::uint32_t k = 0; k < 4; ++k) {
    link.peer().FrameTo(WriteHeader(key, target.addr() + 1024 * k, k == 3), Pattern(k, 1024),
                        wire);
  }
  // RFC 5040 5.5: the Send is delivered after the Writes before it.
  link.peer().FrameTo(SendHeaderOf(1, 0), Pattern(8, 16), wire);
  link.WriteThenBind(wire);
  ASSERT_EQ(WaitCompletions(*node.recv_cq, 1).size(), 1u);
  for (std::uint32_t k = 0; k < 4; ++k) {
    const Bytes want = Pattern(k, 1024);
    EXPECT_TRUE(SameBytes(target.data() + 1024 * k, want.data(), want.size())) << k;
  }
  EXPECT_EQ(node.memory().Deregister(key), DeregisterStatus::kOk);
  link.peer().SendHeader(WriteHeader(key, target.addr()), Pattern(9, 64));
  const std::optional<rdmap::TerminateHeader> t = link.peer().WaitTerminate();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, TerminateCause::DdpInvalidStag());
}

// RFC 5040 7.1: the peer's Terminate is the last message it sends; what
// follows it in the same read is not processed.
TEST_F(BatchErrorTest, PeerTerminateInTheMiddleOfABatch) {
  Build({});
  const rdmap::TerminateHeader term =
      rdmap::MakeTerminate(TerminateCause::RdmapOperationUnspecified());
  std::array<std::uint8_t, 128> buf{};
  const rdmap::EncodeResult r = rdmap::EncodeTerminateMessage(term, 1, buf);
  ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
  FrameUlpduTo(peer(), ByteSpan(buf.data(), r.length), wire_);
  Finish(kBefore + 1);
  ExpectBatchCut();
  EXPECT_TRUE(WaitUntil([&] { return node_.qp->Query().terminate_received.has_value(); }));
  EXPECT_FALSE(node_.qp->Query().terminate_sent.has_value());
}

}  // namespace
}  // namespace siwx::engine::testing
