// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/trace/pcapng.h"

#include <netinet/in.h>

#include <cstring>

namespace siwx::trace {
namespace {

void Put16(std::vector<std::uint8_t>* out, std::uint16_t v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out->insert(out->end(), p, p + 2);
}
void Put32(std::vector<std::uint8_t>* out, std::uint32_t v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out->insert(out->end(), p, p + 4);
}
void PutPadding(std::vector<std::uint8_t>* out) {
  while (out->size() % 4 != 0) out->push_back(0);
}
// A pcapng option: code, length, value padded to 32 bits.
void PutOption(std::vector<std::uint8_t>* out, std::uint16_t code, std::string_view value) {
  Put16(out, code);
  Put16(out, static_cast<std::uint16_t>(value.size()));
  out->insert(out->end(), value.begin(), value.end());
  PutPadding(out);
}
// Fills in the total length at both ends of the block that starts at `start`.
void CloseBlock(std::vector<std::uint8_t>* out, std::size_t start) {
  const auto total = static_cast<std::uint32_t>(out->size() - start + 4);
  Put32(out, total);
  std::memcpy(out->data() + start + 4, &total, 4);
}

// Network-order writers for the synthesized headers.
void Be16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
void Be32(std::uint8_t* p, std::uint32_t v) {
  Be16(p, static_cast<std::uint16_t>(v >> 16));
  Be16(p + 2, static_cast<std::uint16_t>(v));
}

// RFC 1071 one's-complement sum, continued from `sum`.
std::uint32_t SumWords(const std::uint8_t* data, std::size_t length, std::uint32_t sum) {
  std::size_t i = 0;
  for (; i + 1 < length; i += 2) sum += static_cast<std::uint32_t>(data[i] << 8 | data[i + 1]);
  if (i < length) sum += static_cast<std::uint32_t>(data[i] << 8);
  return sum;
}
std::uint16_t FoldChecksum(std::uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

}  // namespace

void AppendSectionHeader(std::vector<std::uint8_t>* out, std::string_view application) {
  const std::size_t start = out->size();
  Put32(out, kBlockSectionHeader);
  Put32(out, 0);  // total length, filled in by CloseBlock
  Put32(out, kByteOrderMagic);
  Put16(out, 1);  // major version
  Put16(out, 0);  // minor version
  Put32(out, 0xFFFFFFFF);  // section length: not given (64 bits)
  Put32(out, 0xFFFFFFFF);
  PutOption(out, 4, application);  // shb_userappl
  Put32(out, 0);                   // opt_endofopt
  CloseBlock(out, start);
}

void AppendEthernetInterface(std::vector<std::uint8_t>* out, std::string_view name) {
  const std::size_t start = out->size();
  Put32(out, kBlockInterfaceDescription);
  Put32(out, 0);
  Put16(out, kLinkTypeEthernet);
  Put16(out, 0);  // reserved
  Put32(out, 0);  // snap length: no limit
  PutOption(out, 2, name);  // if_name
  Put32(out, 0);            // opt_endofopt
  CloseBlock(out, start);
}

std::vector<std::uint8_t> BuildTcpFrame(const TcpSegment& s) {
  const bool v6 = s.source.family == AF_INET6;
  const std::size_t ip_size = v6 ? kIpv6HeaderSize : kIpv4HeaderSize;
  const std::size_t tcp_length = kTcpHeaderSize + s.payload.size();
  std::vector<std::uint8_t> frame(kEthernetHeaderSize + ip_size + tcp_length);
  std::uint8_t* eth = frame.data();
  // Locally administered unicast MACs; which end is which shows in the low octet.
  const std::uint8_t mac_a[6] = {0x02, 0x53, 0x49, 0x57, 0x58, 0x01};
  const std::uint8_t mac_b[6] = {0x02, 0x53, 0x49, 0x57, 0x58, 0x02};
  const bool source_is_lower = std::memcmp(&s.source, &s.destination, sizeof(s.source)) < 0;
  std::memcpy(eth, source_is_lower ? mac_b : mac_a, 6);      // destination
  std::memcpy(eth + 6, source_is_lower ? mac_a : mac_b, 6);  // source
  Be16(eth + 12, v6 ? 0x86DD : 0x0800);

  std::uint8_t* ip = eth + kEthernetHeaderSize;
  std::uint8_t* tcp = ip + ip_size;
  std::uint32_t pseudo = 0;
  if (v6) {
    ip[0] = 0x60;
    Be16(ip + 4, tcp_length <= 0xFFFF ? static_cast<std::uint16_t>(tcp_length) : 0);
    ip[6] = IPPROTO_TCP;
    ip[7] = 64;
    std::memcpy(ip + 8, s.source.address, 16);
    std::memcpy(ip + 24, s.destination.address, 16);
    pseudo = SumWords(ip + 8, 32, 0);
  } else {
    const std::size_t total = kIpv4HeaderSize + tcp_length;
    ip[0] = 0x45;
    Be16(ip + 2, total <= 0xFFFF ? static_cast<std::uint16_t>(total) : 0);
    Be16(ip + 6, 0x4000);  // DF
    ip[8] = 64;
    ip[9] = IPPROTO_TCP;
    std::memcpy(ip + 12, s.source.address, 4);
    std::memcpy(ip + 16, s.destination.address, 4);
    Be16(ip + 10, FoldChecksum(SumWords(ip, kIpv4HeaderSize, 0)));
    pseudo = SumWords(ip + 12, 8, 0);
  }
  pseudo += IPPROTO_TCP;
  pseudo += static_cast<std::uint32_t>(tcp_length & 0xFFFF) +
            static_cast<std::uint32_t>(tcp_length >> 16);

  Be16(tcp, s.source.port);
  Be16(tcp + 2, s.destination.port);
  Be32(tcp + 4, s.seq);
  Be32(tcp + 8, s.ack);
  tcp[12] = 5 << 4;  // data offset: no options
  tcp[13] = s.flags;
  Be16(tcp + 14, s.window);
  if (!s.payload.empty()) {
    std::memcpy(tcp + kTcpHeaderSize, s.payload.data(), s.payload.size());
  }
  Be16(tcp + 16, FoldChecksum(SumWords(tcp, tcp_length, pseudo)));
  return frame;
}

void AppendEnhancedPacket(std::vector<std::uint8_t>* out, ByteSpan frame,
                          std::uint64_t timestamp_us) {
  const std::size_t start = out->size();
  Put32(out, kBlockEnhancedPacket);
  Put32(out, 0);
  Put32(out, 0);  // interface 0
  Put32(out, static_cast<std::uint32_t>(timestamp_us >> 32));
  Put32(out, static_cast<std::uint32_t>(timestamp_us));
  Put32(out, static_cast<std::uint32_t>(frame.size()));  // captured
  Put32(out, static_cast<std::uint32_t>(frame.size()));  // original
  out->insert(out->end(), frame.begin(), frame.end());
  PutPadding(out);
  CloseBlock(out, start);
}

}  // namespace siwx::trace
