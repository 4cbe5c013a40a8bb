// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// SIWX_TRACE: the pcapng blocks, the synthesized packets and the cutting of
// each direction into MPA units (one per TCP segment, as Wireshark's MPA
// dissector expects).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/trace/pcapng.h"
#include "common/trace/stream_trace.h"

namespace siwx::trace {
namespace {

std::uint32_t Le32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint32_t Be32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

// Splits a pcapng byte string into (type, body) blocks, checking that each
// block's two length fields agree and are multiples of 4.
std::vector<std::pair<std::uint32_t, std::vector<std::uint8_t>>> Blocks(
    const std::vector<std::uint8_t>& file) {
  std::vector<std::pair<std::uint32_t, std::vector<std::uint8_t>>> blocks;
  std::size_t at = 0;
  while (at + 12 <= file.size()) {
    const std::uint32_t type = Le32(&file[at]);
    const std::uint32_t length = Le32(&file[at + 4]);
    EXPECT_EQ(length % 4, 0u);
    EXPECT_LE(at + length, file.size());
    if (length < 12 || at + length > file.size()) break;
    EXPECT_EQ(Le32(&file[at + length - 4]), length);
    blocks.emplace_back(type, std::vector<std::uint8_t>(file.begin() + at + 8,
                                                        file.begin() + at + length - 4));
    at += length;
  }
  EXPECT_EQ(at, file.size());
  return blocks;
}

std::uint16_t Checksum(const std::uint8_t* data, std::size_t length, std::uint32_t sum) {
  for (std::size_t i = 0; i + 1 < length; i += 2) sum += std::uint32_t{data[i]} << 8 | data[i + 1];
  if (length % 2) sum += std::uint32_t{data[length - 1]} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(sum);
}

transport::Endpoint V4(const char* address, std::uint16_t port) {
  transport::Endpoint e;
  e.family = AF_INET;
  e.port = port;
  inet_pton(AF_INET, address, e.address);
  return e;
}

TEST(Pcapng, HeaderBlocksAreWellFormed) {
  std::vector<std::uint8_t> out;
  AppendSectionHeader(&out, "siwx test");
  AppendEthernetInterface(&out, "if0");
  const auto blocks = Blocks(out);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].first, kBlockSectionHeader);
  EXPECT_EQ(Le32(blocks[0].second.data()), kByteOrderMagic);
  EXPECT_EQ(blocks[1].first, kBlockInterfaceDescription);
  EXPECT_EQ(blocks[1].second[0] | blocks[1].second[1] << 8, kLinkTypeEthernet);
}

TEST(Pcapng, TcpFrameHasValidChecksumsAndFields) {
  const std::uint8_t payload[] = {1, 2, 3, 4, 5};  // odd length: the checksum pads
  TcpSegment s;
  s.source = V4("192.0.2.1", 4000);
  s.destination = V4("192.0.2.2", 5000);
  s.seq = 0x01020304;
  s.ack = 0xA0B0C0D0;
  s.flags = kTcpAck | kTcpPsh;
  s.payload = payload;
  const std::vector<std::uint8_t> frame = BuildTcpFrame(s);
  ASSERT_EQ(frame.size(), kEthernetHeaderSize + kIpv4HeaderSize + kTcpHeaderSize + 5);
  EXPECT_EQ(frame[12], 0x08);
  const std::uint8_t* ip = frame.data() + kEthernetHeaderSize;
  EXPECT_EQ(Checksum(ip, kIpv4HeaderSize, 0), 0xFFFF) << "IPv4 header checksum";
  EXPECT_EQ(ip[2] << 8 | ip[3], 20 + 20 + 5);
  const std::uint8_t* tcp = ip + kIpv4HeaderSize;
  EXPECT_EQ(tcp[0] << 8 | tcp[1], 4000);
  EXPECT_EQ(tcp[2] << 8 | tcp[3], 5000);
  EXPECT_EQ(Be32(tcp + 4), 0x01020304u);
  EXPECT_EQ(Be32(tcp + 8), 0xA0B0C0D0u);
  std::uint32_t pseudo = Checksum(ip + 12, 8, 0) + IPPROTO_TCP + 25;
  EXPECT_EQ(Checksum(tcp, 25, pseudo), 0xFFFF) << "TCP checksum over the pseudo header";
  EXPECT_EQ(std::memcmp(tcp + 20, payload, 5), 0);

  s.source.family = s.destination.family = AF_INET6;
  const std::vector<std::uint8_t> v6 = BuildTcpFrame(s);
  EXPECT_EQ(v6.size(), kEthernetHeaderSize + kIpv6HeaderSize + kTcpHeaderSize + 5);
  EXPECT_EQ(v6[12], 0x86);
  EXPECT_EQ(v6[kEthernetHeaderSize] >> 4, 6);
}

// RFC 5044 4.1: ULPDU_Length (2) + ULPDU + pad to 4 + CRC (4); 4.3: a marker
// at every 512th stream octet, counted from the first octet after the
// startup frames, belonging to the octet after it.
TEST(StreamTrace, CutsFpdusWithAndWithoutMarkers) {
  std::vector<std::uint8_t> stream(200, 0);
  stream[0] = 0;
  stream[1] = 10;  // ULPDU 10: 2 + 10 = 12, no pad, + CRC = 16
  EXPECT_EQ(CompleteFpduLength(ByteSpan(stream).first(16), false, 0), 16u);
  EXPECT_EQ(CompleteFpduLength(ByteSpan(stream).first(15), false, 0), 0u);
  stream[1] = 11;  // 2 + 11 = 13, pad 3, + CRC = 20
  EXPECT_EQ(CompleteFpduLength(stream, false, 0), 20u);
  // At grid offset 0 the marker comes first: 4 + 20.
  stream[0] = stream[1] = 0;  // the marker
  stream[4] = 0;
  stream[5] = 11;
  EXPECT_EQ(CompleteFpduLength(stream, true, 0), 24u);
  // 500 octets into the grid: 12 octets, the marker at 512, 8 more.
  stream[0] = 0;
  stream[1] = 11;
  EXPECT_EQ(CompleteFpduLength(stream, true, 500), 24u);
  // A marker inside the ULPDU_Length field (511: one octet, marker, one octet).
  stream[0] = 0;
  stream[1] = stream[2] = stream[3] = stream[4] = 0;
  stream[5] = 11;
  EXPECT_EQ(CompleteFpduLength(stream, true, 511), 24u);
  // An FPDU that ends right at a marker position does not take the marker.
  stream[0] = 0;
  stream[1] = 10;
  EXPECT_EQ(CompleteFpduLength(stream, true, 496), 16u);
  EXPECT_EQ(CompleteFpduLength({}, true, 0), 0u);
}

TEST(StreamTrace, ResolvesThePath) {
  EXPECT_EQ(Tracer::ResolvePath("/tmp/t.pcapng", 42, false), "/tmp/t.pcapng");
  EXPECT_EQ(Tracer::ResolvePath("/tmp/t.pcapng", 42, true), "/tmp/t.42.pcapng");
  EXPECT_EQ(Tracer::ResolvePath("/tmp/t-%p.pcapng", 42, false), "/tmp/t-42.pcapng");
  EXPECT_EQ(Tracer::ResolvePath("trace", 7, true), "trace.7");
  EXPECT_EQ(Tracer::ResolvePath("a.d/trace", 7, true), "a.d/trace.7");
  EXPECT_EQ(Tracer::ResolvePath(".hidden", 7, true), ".hidden.7");
}

std::vector<std::uint8_t> StartupFrame(const char* key, std::uint8_t flags,
                                       std::size_t private_data) {
  std::vector<std::uint8_t> frame(20 + private_data, 0xAB);
  std::memcpy(frame.data(), key, 16);
  frame[16] = flags;
  frame[17] = 1;
  frame[18] = static_cast<std::uint8_t>(private_data >> 8);
  frame[19] = static_cast<std::uint8_t>(private_data);
  return frame;
}

TEST(StreamTrace, WritesOneSegmentPerUnitWithConsistentSequenceNumbers) {
  const std::string path =
      ::testing::TempDir() + "/siwx-trace-test-" + std::to_string(::getpid()) + ".pcapng";
  {
    std::unique_ptr<Tracer> tracer = Tracer::Open(path);
    ASSERT_NE(tracer, nullptr);
    EXPECT_EQ(tracer->path(), path);
    // A second tracer on the same FILE (another process would do this) gets
    // FILE.<pid>: the first holds the lock.
    std::unique_ptr<Tracer> second = Tracer::Open(path);
    ASSERT_NE(second, nullptr);
    EXPECT_EQ(second->path(), Tracer::ResolvePath(path, ::getpid(), true));
    ::unlink(second->path().c_str());

    const transport::Endpoints ends{V4("10.0.0.1", 33000), V4("10.0.0.2", 4791)};
    std::shared_ptr<Connection> c = tracer->ConnectionOf(ends);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(tracer->ConnectionOf(ends), c) << "one state per connection";
    // We are the Initiator: Request out (in two pieces), Reply in asking for
    // no markers, then FPDUs both ways, the second split across calls.
    const std::vector<std::uint8_t> request = StartupFrame("MPA ID Req Frame", 0x00, 6);
    tracer->Record(*c, Direction::kSent, ByteSpan(request).first(7));
    tracer->Record(*c, Direction::kSent, ByteSpan(request).subspan(7));
    tracer->Record(*c, Direction::kReceived, StartupFrame("MPA ID Rep Frame", 0x00, 0));
    std::vector<std::uint8_t> fpdus(16 + 20, 0);
    fpdus[1] = 10;
    fpdus[16 + 1] = 11;
    tracer->Record(*c, Direction::kSent, ByteSpan(fpdus).first(20));
    tracer->Record(*c, Direction::kSent, ByteSpan(fpdus).subspan(20));
    tracer->Record(*c, Direction::kReceived, ByteSpan(fpdus).first(16));
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<std::uint8_t> file((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
  ::unlink(path.c_str());
  const auto blocks = Blocks(file);
  // SHB, IDB, SYN, SYN-ACK, ACK, Request, Reply, 2 FPDUs out, 1 in.
  ASSERT_EQ(blocks.size(), 10u);
  struct Seen {
    std::uint16_t source_port;
    std::uint32_t seq, ack;
    std::uint8_t flags;
    std::size_t payload;
  };
  std::vector<Seen> packets;
  for (std::size_t i = 2; i < blocks.size(); ++i) {
    ASSERT_EQ(blocks[i].first, kBlockEnhancedPacket);
    const std::uint8_t* frame = blocks[i].second.data() + 20;
    const std::uint32_t captured = Le32(blocks[i].second.data() + 12);
    const std::uint8_t* tcp = frame + kEthernetHeaderSize + kIpv4HeaderSize;
    packets.push_back({static_cast<std::uint16_t>(tcp[0] << 8 | tcp[1]), Be32(tcp + 4),
                       Be32(tcp + 8), tcp[13],
                       captured - kEthernetHeaderSize - kIpv4HeaderSize - kTcpHeaderSize});
  }
  EXPECT_EQ(packets[0].flags, kTcpSyn);
  EXPECT_EQ(packets[0].source_port, 33000);
  EXPECT_EQ(packets[1].flags, kTcpSyn | kTcpAck);
  EXPECT_EQ(packets[1].ack, packets[0].seq + 1);
  const std::uint32_t our_first = packets[0].seq + 1;
  const std::uint32_t their_first = packets[1].seq + 1;
  EXPECT_EQ(packets[3].payload, 26u);  // Request with its private data, one segment
  EXPECT_EQ(packets[3].seq, our_first);
  EXPECT_EQ(packets[4].source_port, 4791);
  EXPECT_EQ(packets[4].payload, 20u);
  EXPECT_EQ(packets[4].seq, their_first);
  EXPECT_EQ(packets[4].ack, our_first + 26);
  EXPECT_EQ(packets[5].payload, 16u);
  EXPECT_EQ(packets[5].seq, our_first + 26);
  EXPECT_EQ(packets[5].ack, their_first + 20);
  EXPECT_EQ(packets[6].payload, 20u);
  EXPECT_EQ(packets[6].seq, our_first + 42);
  EXPECT_EQ(packets[7].payload, 16u);
  EXPECT_EQ(packets[7].seq, their_first + 20);
  EXPECT_EQ(packets[7].ack, our_first + 62);
}

}  // namespace
}  // namespace siwx::trace
