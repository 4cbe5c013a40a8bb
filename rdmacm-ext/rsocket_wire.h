// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The rsocket protocol's wire formats (librdmacm's docs/rsocket and
// rsocket(7); the layouts and constants are facts read from rdma-core's
// librdmacm/rsocket.c, recorded in docs/rsockets.md). Pure data and codecs,
// no verbs: unit-tested on their own.
//
//  - Connection private data (request and reply): struct rs_conn_data,
//    40 octets, multi-octet fields big-endian.
//  - 32-bit messages: bits 31:29 the type, 28:0 the argument. On iWARP
//    (no RDMA Write with Immediate) each message is a 4-octet Send whose
//    payload is the message in the sender's host byte order, as stock
//    rsockets sends it; application data goes by RDMA Write into the
//    peer's receive buffer just before the DATA message that announces it.
//  - Target SGL entries (16 octets) and iomap entries (24 octets) that one
//    end RDMA-Writes into the other's tables, in the receiver's byte order
//    (RS_CONN_FLAG_NET says which one that is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace siwx::rs::wire {

inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::uint8_t kFlagNet = 1 << 0;    // sender is big-endian
inline constexpr std::uint8_t kFlagIomap = 1 << 1;  // target_iomap_size is valid
inline constexpr int kSglSize = 2;                  // entries in a target SGL
inline constexpr std::size_t kConnDataSize = 40;
inline constexpr std::size_t kSgeSize = 16;    // struct rs_sge: addr, key, length
inline constexpr std::size_t kIomapSize = 24;  // struct rs_iomap: offset, rs_sge
inline constexpr std::size_t kMsgSize = 4;

// Message types (bits 31:29).
enum Op : std::uint32_t {
  kOpData = 0,      // argument: bytes written into the receive buffer
  kOpSgl = 4,       // argument: receive credits granted (a sequence number)
  kOpIomapSgl = 6,  // argument: index of the updated iomap entry
  kOpCtrl = 7,      // argument: one of Ctrl
};
enum Ctrl : std::uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };

constexpr std::uint32_t MakeMsg(std::uint32_t op, std::uint32_t arg) {
  return (op << 29) | (arg & 0x1FFFFFFFu);
}
constexpr std::uint32_t MsgOp(std::uint32_t msg) { return msg >> 29; }
constexpr std::uint32_t MsgArg(std::uint32_t msg) { return msg & 0x1FFFFFFFu; }

struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t key = 0;
  std::uint32_t length = 0;
};

struct ConnData {
  std::uint8_t version = kVersion;
  std::uint8_t flags = 0;
  std::uint16_t credits = 0;
  std::uint8_t target_iomap_size = 0;  // scaled, see ScaleEncode
  Sge target_sgl;                      // length: number of entries
  Sge data_buf;                        // the first receive buffer
};

// The 8-bit scale of target_iomap_size: values up to 128 as they are,
// larger ones as 0x80 | value >> 8.
constexpr std::uint8_t ScaleEncode(int value) {
  return static_cast<std::uint8_t>(value <= 128 ? value : (0x80 | (value >> 8)));
}
constexpr int ScaleDecode(std::uint8_t scaled) {
  return scaled <= 128 ? scaled : (scaled & 0x7F) << 8;
}

constexpr bool HostIsBigEndian() { return __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__; }

namespace detail {
inline void PutBe(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<std::uint8_t>(v);
}
inline std::uint64_t GetBe(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}
inline void PutSgeBe(std::uint8_t* p, const Sge& s) {
  PutBe(p, s.addr, 8);
  PutBe(p + 8, s.key, 4);
  PutBe(p + 12, s.length, 4);
}
inline Sge GetSgeBe(const std::uint8_t* p) {
  return Sge{GetBe(p, 8), static_cast<std::uint32_t>(GetBe(p + 8, 4)),
             static_cast<std::uint32_t>(GetBe(p + 12, 4))};
}
}  // namespace detail

// Octets 0..39: version, flags, credits (be16), 3 reserved, iomap size,
// target SGL (be64 addr, be32 key, be32 length), data buffer (same).
inline void EncodeConnData(const ConnData& c, std::uint8_t out[kConnDataSize]) {
  std::memset(out, 0, kConnDataSize);
  out[0] = c.version;
  out[1] = c.flags;
  detail::PutBe(out + 2, c.credits, 2);
  out[7] = c.target_iomap_size;
  detail::PutSgeBe(out + 8, c.target_sgl);
  detail::PutSgeBe(out + 24, c.data_buf);
}

// False if `len` is too short or the version is not 1.
inline bool DecodeConnData(const void* data, std::size_t len, ConnData* c) {
  if (data == nullptr || len < kConnDataSize) return false;
  const auto* p = static_cast<const std::uint8_t*>(data);
  c->version = p[0];
  c->flags = p[1];
  c->credits = static_cast<std::uint16_t>(detail::GetBe(p + 2, 2));
  c->target_iomap_size = p[7];
  c->target_sgl = detail::GetSgeBe(p + 8);
  c->data_buf = detail::GetSgeBe(p + 24);
  return c->version == kVersion;
}

// Table entries in the byte order of the end that owns the table: host
// order, swapped when `swap` (the two ends differ in endianness).
inline std::uint64_t MaybeSwap64(std::uint64_t v, bool swap) {
  return swap ? __builtin_bswap64(v) : v;
}
inline std::uint32_t MaybeSwap32(std::uint32_t v, bool swap) {
  return swap ? __builtin_bswap32(v) : v;
}

inline void EncodeSge(const Sge& s, bool swap, std::uint8_t out[kSgeSize]) {
  const std::uint64_t addr = MaybeSwap64(s.addr, swap);
  const std::uint32_t key = MaybeSwap32(s.key, swap);
  const std::uint32_t length = MaybeSwap32(s.length, swap);
  std::memcpy(out, &addr, 8);
  std::memcpy(out + 8, &key, 4);
  std::memcpy(out + 12, &length, 4);
}

inline Sge DecodeSge(const std::uint8_t in[kSgeSize]) {
  Sge s;
  std::memcpy(&s.addr, in, 8);
  std::memcpy(&s.key, in + 8, 4);
  std::memcpy(&s.length, in + 12, 4);
  return s;
}

struct Iomap {
  std::uint64_t offset = 0;
  Sge sge;
};

inline void EncodeIomap(const Iomap& m, bool swap, std::uint8_t out[kIomapSize]) {
  const std::uint64_t offset = MaybeSwap64(m.offset, swap);
  std::memcpy(out, &offset, 8);
  EncodeSge(m.sge, swap, out + 8);
}

inline Iomap DecodeIomap(const std::uint8_t in[kIomapSize]) {
  Iomap m;
  std::memcpy(&m.offset, in, 8);
  m.sge = DecodeSge(in + 8);
  return m;
}

}  // namespace siwx::rs::wire
