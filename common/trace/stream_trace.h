// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// SIWX_TRACE=FILE: every iWARP stream of the process, both directions, as a
// pcapng file Wireshark and tshark decode as MPA/DDP/RDMAP.
//
// The bytes are recorded where they cross the socket: common/transport (the
// engine's data path) and, through siwx_trace_stream_io() exported by the
// provider, the CM's startup-frame I/O. One Tracer per process (the
// provider's), so a connection's startup frames and FPDUs share one stream
// state, keyed by the connection's addresses.
//
// Wireshark's MPA dissector expects each TCP segment to start with an MPA
// Request, Reply or FPDU (or the marker in front of one) and to hold exactly
// one. So each direction is cut into units first: a startup frame (20
// octets + private data), then FPDUs (ULPDU_Length + pad + CRC, plus the
// markers the peer's M bit asked for, RFC 5044 4.3, counted from the first
// octet after the startup frame). Each unit becomes one synthesized
// Ethernet/IP/TCP packet with the real addresses and ports; sequence numbers
// count the stream octets from a per-connection start, acknowledgements what
// the other direction has shown so far. A connection whose first unit is an
// MPA Request gets a synthesized three-way handshake in front. What cannot
// be cut (not MPA, a lost unit) goes out as it came.
//
// The file is FILE itself when this process can lock it (flock), otherwise
// (another live process writes FILE) FILE with ".<pid>" before the extension;
// "%p" in FILE is replaced by the process id. Costs one predictable branch per
// socket call when unset.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/transport/endpoints.h"
#include "common/util/bytes.h"

namespace siwx::trace {

enum class Direction : std::uint8_t { kSent = 0, kReceived = 1 };

class Tracer;

// One traced TCP connection (both directions).
class Connection {
 public:
  const transport::Endpoints& endpoints() const { return endpoints_; }

 private:
  friend class Tracer;
  enum class Phase : std::uint8_t { kStartup, kFpdus, kRaw };
  struct Half {
    Phase phase = Phase::kStartup;
    bool markers = false;             // this direction carries markers
    std::uint64_t full_operation_start = 0;  // stream offset of the first FPDU octet
    std::uint64_t emitted = 0;        // stream octets written to the file
    std::vector<std::uint8_t> pending;  // octets of a unit not yet complete
    std::uint32_t isn = 0;
  };
  transport::Endpoints endpoints_;
  Half halves_[2];  // indexed by Direction
  bool started_ = false;  // the first packet (or handshake) went out
};

class Tracer {
 public:
  // The process's tracer, or nullptr when SIWX_TRACE is unset or its file
  // cannot be opened (said once at warn). Read once per process.
  static Tracer* Global();
  // A tracer writing to `setting` (the SIWX_TRACE value) for tests.
  static std::unique_ptr<Tracer> Open(const std::string& setting);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // The traced connection of TCP socket `fd` (by its addresses), created on
  // first use; nullptr when `fd` is not a connected TCP socket.
  std::shared_ptr<Connection> ConnectionOf(int fd);
  std::shared_ptr<Connection> ConnectionOf(const transport::Endpoints& endpoints);
  // Records `bytes` octets that moved through `iov` (in order).
  void Record(Connection& connection, Direction direction, std::span<const iovec> iov,
              std::size_t bytes);
  void Record(Connection& connection, Direction direction, ByteSpan data);
  // The stream ended: drop its state (a later connection may reuse the ports).
  void Forget(const Connection& connection);

  const std::string& path() const { return path_; }

  // FILE with "%p" replaced and, when `suffix_pid`, ".<pid>" before the
  // extension (exposed for tests).
  static std::string ResolvePath(const std::string& setting, int pid, bool suffix_pid);

 private:
  Tracer() = default;
  void Append(Connection& c, Direction d, ByteSpan data);
  void EmitUnits(Connection& c, Direction d, std::vector<std::uint8_t>* out);
  void EmitPacket(Connection& c, Direction d, ByteSpan payload, std::uint8_t flags,
                  std::vector<std::uint8_t>* out);
  void EmitHandshake(Connection& c, Direction requester, std::vector<std::uint8_t>* out);
  void WriteOut(const std::vector<std::uint8_t>& blocks);

  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Connection>> connections_;
  bool write_failed_ = false;
};

// The length of the complete MPA unit at the start of `data` for a half in
// FPDU phase whose first octet sits `grid_offset` octets past a marker
// position (markers on) — or 0 when `data` does not hold all of it yet.
std::size_t CompleteFpduLength(ByteSpan data, bool markers, std::uint64_t grid_offset);

}  // namespace siwx::trace
