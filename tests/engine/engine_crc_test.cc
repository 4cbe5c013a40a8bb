// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The MPA CRC through the engine: it covers the FPDU as sent, markers
// included (RFC 5044 4.3, 4.4), in both directions, checked against a CRC
// computed apart from the library (test_tools/fpdu_reference.h, a bitwise
// CRC32c); and it covers exactly the octets sent when the application
// changes the source of an RDMA Read while the Read Responses go out.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "test_tools/fpdu_reference.h"

namespace siwx::engine::testing {
namespace {

using Bytes = std::vector<std::uint8_t>;

// What an independent walk over one direction's stream (markers on, grid
// starting at its first octet) found.
struct CrcWalk {
  std::size_t fpdus = 0;
  std::size_t bad_crcs = 0;
  std::size_t markers_inside = 0;     // markers after the first octet of ULPDU_Length
  std::size_t leading_markers = 0;    // FPDUs that start with a marker (FPDUPTR 0)
  std::size_t markers_before_crc = 0;  // markers between the pad and the CRC field
  std::size_t leftover = 0;           // octets of an incomplete last FPDU
};

// Finds the FPDUs of `wire` by itself: a marker at every 512th octet, then
// ULPDU_Length, ULPDU, pad and CRC; checks each CRC over the octets from the
// FPDU's first octet (its leading marker, if any) to the CRC field.
CrcWalk WalkCrcs(const Bytes& wire) {
  std::vector<std::size_t> at;  // wire index of every octet that is not a marker's
  for (std::size_t i = 0; i < wire.size(); ++i) {
    if (i % 512 < 4) continue;
    at.push_back(i);
  }
  CrcWalk walk;
  std::size_t k = 0;
  while (k + 2 <= at.size()) {
    const std::size_t length = (std::size_t{wire[at[k]]} << 8) | wire[at[k + 1]];
    const std::size_t total = 2 + length + (4 - (2 + length) % 4) % 4 + 4;
    if (k + total > at.size()) break;
    const std::size_t first = at[k];
    const bool leading = first >= 4 && (first - 4) % 512 == 0;
    const std::size_t start = leading ? first - 4 : first;
    const std::size_t crc_at = at[k + total - 4];
    const std::uint32_t want = mpa::reference::Crc32c(Bytes(wire.begin() + static_cast<std::ptrdiff_t>(start),
                                                       wire.begin() + static_cast<std::ptrdiff_t>(crc_at)));
    std::uint32_t got = 0;
    for (int j = 0; j < 4; ++j) got |= std::uint32_t{wire[at[k + total - 4 + j]]} << (8 * j);
    ++walk.fpdus;
    if (got != want) ++walk.bad_crcs;
    if (leading) ++walk.leading_markers;
    walk.markers_inside += (crc_at - 1) / 512 - first / 512;  // multiples of 512 in (first, crc_at)
    if (crc_at >= 4 && (crc_at - 4) % 512 == 0) ++walk.markers_before_crc;
    k += total;
  }
  walk.leftover = at.size() - k;
  return walk;
}

TEST(EngineCrc, EngineSendsACrcThatCoversItsMarkers) {
  // Writes of many sizes in FPDUs of at most 1024 octets: the FPDU
  // boundaries walk across the grid, so some FPDUs start with a marker and
  // some have one between pad and CRC. A raw peer records the stream and
  // checks every CRC with the bitwise reference.
  Node node;
  RawLink link(node, {.crc = true, .markers = true, .max_ulpdu = 1024});
  constexpr int kWrites = 120;
  Buffer src(kWrites * 41 + 8);
  src.Fill(5);
  const std::uint32_t key = src.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  std::size_t segments = 0;
  std::size_t octets = 0;
  for (int i = 0; i < kWrites; ++i) {
    const std::size_t size = static_cast<std::size_t>(i) * 41 + 1;
    SendWorkRequest wr = MakeSend(static_cast<std::uint64_t>(i), SendOpcode::kRdmaWrite, 0);
    AddSge(wr, src.addr(), static_cast<std::uint32_t>(size), key);
    wr.rkey = 0x1234;
    wr.remote_addr = 0x10000;
    ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
    segments += (size + (1024 - rdmap::kDdpTaggedHeaderSize) - 1) / (1024 - rdmap::kDdpTaggedHeaderSize);
    octets += size;
  }
  ASSERT_TRUE(link.peer->WaitSegments(segments));
  ASSERT_GT(octets, 150u * 512u);  // across hundreds of marker positions
  const CrcWalk walk = WalkCrcs(link.peer->raw());
  EXPECT_EQ(walk.fpdus, segments);
  EXPECT_EQ(walk.bad_crcs, 0u);
  EXPECT_EQ(walk.leftover, 0u);
  EXPECT_GT(walk.markers_inside, 100u);
  EXPECT_GE(walk.leading_markers, 1u);
  EXPECT_GE(walk.markers_before_crc, 1u);
  EXPECT_EQ(link.peer->parse_error(), mpa::MpaError::kNone);
}

TEST(EngineCrc, EngineAcceptsFpdusWhoseCrcCoversTheirMarkers) {
  // The raw peer sends Writes framed by the reference model (the CRC over
  // the FPDU as sent, markers included), then a Send; the engine must place
  // them all and complete the Send, with no Terminate.
  Node node;
  RawLink link(node, {.crc = true, .markers = true});
  constexpr std::size_t kSize = 64 * 1024;
  Buffer sink(kSize);
  const std::uint32_t stag = sink.Register(node.memory(), node.pd, kAllRemote);
  Buffer recv(64);
  const std::uint32_t recv_key = recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  PostRecv(node, 1, recv, recv_key);

  Bytes want(kSize);
  for (std::size_t i = 0; i < kSize; ++i) want[i] = PatternByte(9, i);
  Bytes stream;
  std::size_t leading = 0;
  auto add = [&](const rdmap::DdpRdmapHeader& h, ByteSpan payload) {
    std::array<std::uint8_t, 128> buf{};
    const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(h, buf);
    ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
    Bytes ulpdu(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r.length));
    ulpdu.insert(ulpdu.end(), payload.begin(), payload.end());
    if (stream.size() % 512 == 0) ++leading;
    const Bytes fpdu =
        mpa::reference::MarkedFpdu(ulpdu, true, static_cast<std::uint32_t>(stream.size() % 512));
    stream.insert(stream.end(), fpdu.begin(), fpdu.end());
  };
  std::size_t to = 0;
  for (std::size_t i = 0; to < kSize; ++i) {
    const std::size_t n = std::min(kSize - to, 1 + (i * 53) % 1400);
    add(WriteHeader(stag, sink.addr() + to), ByteSpan(want.data() + to, n));
    to += n;
  }
  const Bytes hello = {'d', 'o', 'n', 'e'};
  add(SendHeaderOf(1, 0), hello);
  ASSERT_GE(leading, 1u);  // the first FPDU at least starts behind a marker
  link.peer->WriteAll(stream);

  const auto wc = WaitCompletions(*node.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].byte_len, hello.size());
  EXPECT_TRUE(SameBytes(sink.data(), want.data(), kSize));
  EXPECT_TRUE(SameBytes(recv.data(), hello.data(), hello.size()));
  EXPECT_FALSE(node.events.Has(AsyncEventType::kQpFatal));
  link.peer->Pump(std::chrono::milliseconds(50));
  EXPECT_TRUE(link.peer->segments().empty());  // no Terminate
}

TEST(EngineCrc, TwoEnginesWithCrcAndMarkersMoveDataBothWays) {
  // CRC and markers on both directions over TCP: a Write, a Read and a Send
  // of sizes spanning thousands of marker positions.
  Node a;
  Node b;
  Link(a, b, Transport::kTcp, {.crc = true, .markers = true});
  constexpr std::size_t kSize = 1 << 20;
  Buffer a_src(kSize);
  a_src.Fill(21);
  Buffer b_dst(kSize);
  Buffer b_src(kSize);
  b_src.Fill(22);
  Buffer a_dst(kSize);
  const std::uint32_t a_src_key = a_src.Register(a.memory(), a.pd, kAllRemote);
  const std::uint32_t a_dst_key = a_dst.Register(a.memory(), a.pd, kAllRemote);
  const std::uint32_t b_dst_key = b_dst.Register(b.memory(), b.pd, kAllRemote);
  const std::uint32_t b_src_key = b_src.Register(b.memory(), b.pd, kAllRemote);
  Buffer msg(300 * 1000 + 3);
  msg.Fill(23);
  const std::uint32_t msg_key = msg.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  Buffer inbox(msg.size());
  const std::uint32_t inbox_key = inbox.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  PostRecv(b, 7, inbox, inbox_key);

  SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
  AddSplitSges(write, a_src.addr(), kSize, a_src_key, 3);
  write.rkey = b_dst_key;
  write.remote_addr = b_dst.addr();
  ASSERT_EQ(a.qp->PostSend(write), PostStatus::kOk);
  SendWorkRequest read = MakeSend(2, SendOpcode::kRdmaRead);
  AddSge(read, a_dst.addr(), static_cast<std::uint32_t>(kSize), a_dst_key);
  read.rkey = b_src_key;
  read.remote_addr = b_src.addr();
  ASSERT_EQ(a.qp->PostSend(read), PostStatus::kOk);
  SendWorkRequest send = MakeSend(3, SendOpcode::kSend);
  AddSge(send, msg.addr(), static_cast<std::uint32_t>(msg.size()), msg_key);
  ASSERT_EQ(a.qp->PostSend(send), PostStatus::kOk);

  const auto sent = WaitCompletions(*a.send_cq, 3);
  ASSERT_EQ(sent.size(), 3u);
  for (const WorkCompletion& wc : sent) EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.wr_id;
  const auto got = WaitCompletions(*b.recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].byte_len, msg.size());
  // The Send completes after the Write before it was placed (RFC 5040 5.5).
  EXPECT_TRUE(SameBytes(b_dst.data(), a_src.data(), kSize));
  EXPECT_TRUE(SameBytes(a_dst.data(), b_src.data(), kSize));
  EXPECT_TRUE(SameBytes(inbox.data(), msg.data(), msg.size()));
  EXPECT_FALSE(a.events.Has(AsyncEventType::kQpFatal));
  EXPECT_FALSE(b.events.Has(AsyncEventType::kQpFatal));
}

TEST(EngineCrc, ReadResponsesStagedPieceByPieceGoOutAsTheReferenceFramesThem) {
  // With CRC on, the responder copies each Read Response segment into a
  // staging buffer and sends at most a few hundred KiB of copies per
  // sendmsg, reusing the buffers sendmsg has just read (tx.h). Two Reads of
  // odd sizes and offsets, about 1.7 MB in 16 KiB FPDUs, so the buffers are
  // reused several times: the stream must be, octet for octet, the Read
  // Responses the reference model frames from the source (RFC 5040 4.4,
  // 5.2; RFC 5044 4.1, 4.3, 4.4: CRC over the FPDU as sent, markers
  // included). CRC off (sent in place) is the same stream with zero CRCs.
  for (const bool crc : {true, false}) {
    for (const bool markers : {false, true}) {
      SCOPED_TRACE(std::string(crc ? "CRC" : "no CRC") + (markers ? ", markers" : ""));
      Node node;
      const LinkOptions o{.crc = crc, .markers = markers, .max_ulpdu = 16384};
      RawLink link(node, o);
      Buffer source((1 << 20) + 16);
      source.Fill(31);
      const std::uint32_t rkey = source.Register(node.memory(), node.pd, kAllRemote);
      struct Read {
        std::uint32_t size;
        std::uint64_t offset;
        std::uint32_t sink_stag;
        std::uint64_t sink_to;
      };
      const Read reads[] = {{(1 << 20) + 3, 0, 0x100, 0x7000}, {700001, 5, 0x200, 0x123457}};
      const std::size_t room = o.max_ulpdu - rdmap::kDdpTaggedHeaderSize;
      Bytes want;
      std::size_t segments = 0;
      std::uint32_t msn = 1;
      for (const Read& r : reads) {
        rdmap::ReadRequestBody body;
        body.sink_stag = r.sink_stag;
        body.sink_to = r.sink_to;
        body.read_size = r.size;
        body.source_stag = rkey;
        body.source_to = source.addr() + r.offset;
        link.peer->SendHeader(ReadRequestOf(msn++, body));
        for (std::size_t done = 0; done < r.size; done += room) {
          const std::size_t n = std::min<std::size_t>(room, r.size - done);
          rdmap::DdpRdmapHeader h =
              rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, done + n == r.size);
          h.stag = r.sink_stag;
          h.to = r.sink_to + done;
          std::array<std::uint8_t, 128> buf{};
          const rdmap::EncodeResult e = rdmap::EncodeDdpRdmapHeader(h, buf);
          ASSERT_EQ(e.status, rdmap::EncodeStatus::kOk);
          Bytes ulpdu(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(e.length));
          const std::uint8_t* from = source.data() + r.offset + done;
          ulpdu.insert(ulpdu.end(), from, from + n);
          const Bytes fpdu =
              markers ? mpa::reference::MarkedFpdu(ulpdu, crc,
                                                   static_cast<std::uint32_t>(want.size() % 512))
                      : mpa::reference::UnmarkedFpdu(ulpdu, crc);
          want.insert(want.end(), fpdu.begin(), fpdu.end());
          ++segments;
        }
      }
      ASSERT_GT(want.size(), std::size_t{1500} * 1024);  // several times the staging cap
      ASSERT_TRUE(link.peer->WaitSegments(segments));
      EXPECT_EQ(link.peer->segments().size(), segments);
      EXPECT_EQ(link.peer->parse_error(), mpa::MpaError::kNone);
      const Bytes& got = link.peer->raw();
      ASSERT_EQ(got.size(), want.size());
      std::size_t first_difference = got.size();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want[i]) {
          first_difference = i;
          break;
        }
      }
      EXPECT_EQ(first_difference, got.size()) << "the stream differs from the reference there";
      EXPECT_FALSE(node.events.Has(AsyncEventType::kQpFatal));
    }
  }
}

// The application's writes into the source of an RDMA Read: verbs lets it
// change that memory at any time, so these writes race the engine's reads
// by design. They are kept out of TSan's sight (not instrumented) so that
// the test checks what it is about: the CRC on the wire.
__attribute__((no_sanitize("thread"))) void ScribbleUntilStopped(std::uint8_t* region,
                                                                   std::size_t size,
                                                                   const std::atomic<bool>& stop) {
  volatile std::uint8_t* p = region;
  std::uint32_t x = 12345;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int k = 0; k < 4096; ++k) {
      x = x * 1664525u + 1013904223u;
      const std::size_t at = (x >> 8) % size;
      p[at] = static_cast<std::uint8_t>(p[at] ^ 0x5A);
    }
    std::this_thread::yield();  // leave the engine threads their share of the CPU
  }
}

TEST(EngineCrc, ReadResponseCrcCoversTheOctetsSentWhileTheSourceChanges) {
  // The responder's application keeps changing the Read source while its
  // Read Responses go out with CRC on. The CRC must cover exactly the octets
  // sent: no CRC error, no Terminate, every Read completes (the data read is
  // some mix of old and new octets, which is allowed). Before the fix the
  // CRC was computed at framing time over the live memory, and sendmsg read
  // it later: the reader saw a CRC error within the first Reads.
  for (const bool markers : {false, true}) {
    SCOPED_TRACE(markers ? "CRC and markers" : "CRC");
    Node a;
    Node b;
    Link(a, b, Transport::kSocketPair, {.crc = true, .markers = markers});
    constexpr std::size_t kSize = 1 << 20;
    constexpr int kReads = 12;
    Buffer src(kSize);
    src.Fill(41);
    const std::uint32_t rkey = src.Register(b.memory(), b.pd, kAllRemote);
    Buffer dst(kSize);
    const std::uint32_t sink = dst.Register(a.memory(), a.pd, kAllRemote);

    std::atomic<bool> stop{false};
    std::thread application([&] { ScribbleUntilStopped(src.data(), kSize, stop); });
    for (int i = 0; i < kReads; ++i) {
      SendWorkRequest read = MakeSend(static_cast<std::uint64_t>(i), SendOpcode::kRdmaRead);
      AddSge(read, dst.addr(), static_cast<std::uint32_t>(kSize), sink);
      read.rkey = rkey;
      read.remote_addr = src.addr();
      ASSERT_EQ(a.qp->PostSend(read), PostStatus::kOk);
    }
    const auto wc = WaitCompletions(*a.send_cq, kReads);
    stop.store(true, std::memory_order_relaxed);
    application.join();

    ASSERT_EQ(wc.size(), static_cast<std::size_t>(kReads));
    for (const WorkCompletion& c : wc) {
      EXPECT_EQ(c.status, WcStatus::kSuccess) << c.wr_id;
      EXPECT_EQ(c.byte_len, kSize);
    }
    EXPECT_FALSE(a.events.Has(AsyncEventType::kQpFatal));
    EXPECT_FALSE(b.events.Has(AsyncEventType::kQpFatal));
    EXPECT_TRUE(dst.GuardsIntact());
  }
}

}  // namespace
}  // namespace siwx::engine::testing
