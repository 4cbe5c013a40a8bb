// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// pcapng blocks (draft-ietf-opsawg-pcapng: Section Header, Interface
// Description, Enhanced Packet) carrying synthesized Ethernet/IPv4-or-IPv6/TCP
// packets, for the SIWX_TRACE wire trace. Pure functions over byte vectors;
// stream_trace.h decides what goes into them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/transport/endpoints.h"
#include "common/util/bytes.h"

namespace siwx::trace {

inline constexpr std::uint32_t kBlockSectionHeader = 0x0A0D0D0A;
inline constexpr std::uint32_t kBlockInterfaceDescription = 0x00000001;
inline constexpr std::uint32_t kBlockEnhancedPacket = 0x00000006;
inline constexpr std::uint32_t kByteOrderMagic = 0x1A2B3C4D;
inline constexpr std::uint16_t kLinkTypeEthernet = 1;

// TCP flags.
inline constexpr std::uint8_t kTcpFin = 0x01;
inline constexpr std::uint8_t kTcpSyn = 0x02;
inline constexpr std::uint8_t kTcpPsh = 0x08;
inline constexpr std::uint8_t kTcpAck = 0x10;

// Ethernet + IP + TCP header octets in front of the payload.
inline constexpr std::size_t kEthernetHeaderSize = 14;
inline constexpr std::size_t kIpv4HeaderSize = 20;
inline constexpr std::size_t kIpv6HeaderSize = 40;
inline constexpr std::size_t kTcpHeaderSize = 20;

// Appends a Section Header Block (host byte order, section length unknown)
// naming `application` in shb_userappl.
void AppendSectionHeader(std::vector<std::uint8_t>* out, std::string_view application);
// Appends an Interface Description Block: Ethernet, no snap length limit,
// microsecond timestamps (the default if_tsresol), named `name`.
void AppendEthernetInterface(std::vector<std::uint8_t>* out, std::string_view name);

struct TcpSegment {
  transport::Endpoint source;
  transport::Endpoint destination;  // same family as source
  std::uint32_t seq = 0;
  std::uint32_t ack = 0;
  std::uint8_t flags = kTcpAck;
  std::uint16_t window = 0xFFFF;
  ByteSpan payload;
  std::uint64_t timestamp_us = 0;  // since the Unix epoch
};

// The Ethernet frame of `segment` (locally administered MACs, valid IPv4
// header checksum and TCP checksum). An IPv4 packet too long for its 16-bit
// total length gets 0 there, which Wireshark reads as a TSO capture.
std::vector<std::uint8_t> BuildTcpFrame(const TcpSegment& segment);

// Appends an Enhanced Packet Block on interface 0 holding `frame`.
void AppendEnhancedPacket(std::vector<std::uint8_t>* out, ByteSpan frame,
                          std::uint64_t timestamp_us);

}  // namespace siwx::trace
