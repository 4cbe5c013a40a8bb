// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/trace/stream_trace.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/trace/pcapng.h"
#include "common/util/log.h"
#include "common/wire/mpa_constants.h"

namespace siwx::trace {
namespace {

constexpr std::size_t kStartupHeaderSize = 20;  // key 16, flags, Rev, PD_Length (RFC 5044 7.1.1)
constexpr char kRequestKey[] = "MPA ID Req Frame";
constexpr char kReplyKey[] = "MPA ID Rep Frame";
constexpr std::uint8_t kMarkerFlag = 0x80;  // M, RFC 5044 7.1.1

std::uint64_t NowMicros() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

// A per-connection starting sequence number: any value works for Wireshark;
// different ones per direction keep the two apart when reading raw numbers.
std::uint32_t InitialSequence(const transport::Endpoint& from, const transport::Endpoint& to) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  auto mix = [&h](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 16777619u;
  };
  mix(&from, sizeof(from));
  mix(&to, sizeof(to));
  return h;
}

Direction Other(Direction d) {
  return d == Direction::kSent ? Direction::kReceived : Direction::kSent;
}

}  // namespace

std::size_t CompleteFpduLength(ByteSpan data, bool markers, std::uint64_t grid_offset) {
  // Walks wire octets from the unit's first one; a marker sits where the
  // position is a multiple of 512 and belongs to the octet after it, so a
  // marker right after the CRC is the next FPDU's.
  std::size_t wire = 0;
  auto skip_marker = [&]() -> bool {
    if (markers && (grid_offset + wire) % mpa::kMarkerInterval == 0) {
      wire += mpa::kMarkerSize;
      if (wire > data.size()) return false;
    }
    return true;
  };
  std::uint8_t length_octets[2];
  for (std::uint8_t& octet : length_octets) {
    if (!skip_marker() || wire >= data.size()) return 0;
    octet = data[wire++];
  }
  const std::size_t ulpdu = static_cast<std::size_t>(length_octets[0] << 8 | length_octets[1]);
  const std::size_t pad = (mpa::kPadAlign - (2 + ulpdu) % mpa::kPadAlign) % mpa::kPadAlign;
  std::size_t left = ulpdu + pad + mpa::kCrcSize;
  while (left > 0) {
    if (!skip_marker()) return 0;
    // Octets up to the next marker position, or what is left.
    std::size_t run = left;
    if (markers) {
      const auto position = static_cast<std::size_t>((grid_offset + wire) % mpa::kMarkerInterval);
      const std::size_t to_marker = mpa::kMarkerInterval - position;
      if (to_marker < run) run = to_marker;
    }
    wire += run;
    left -= run;
    if (wire > data.size()) return 0;
  }
  return wire;
}

std::string Tracer::ResolvePath(const std::string& setting, int pid, bool suffix_pid) {
  std::string path;
  const std::string id = std::to_string(pid);
  for (std::size_t i = 0; i < setting.size(); ++i) {
    if (setting[i] == '%' && i + 1 < setting.size() && setting[i + 1] == 'p') {
      path += id;
      ++i;
    } else {
      path += setting[i];
    }
  }
  if (!suffix_pid) return path;
  const std::size_t slash = path.rfind('/');
  const std::size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1)) {
    return path + "." + id;
  }
  return path.substr(0, dot) + "." + id + path.substr(dot);
}

std::unique_ptr<Tracer> Tracer::Open(const std::string& setting) {
  const int pid = static_cast<int>(::getpid());
  const bool explicit_pid = setting.find("%p") != std::string::npos;
  std::unique_ptr<Tracer> tracer(new Tracer());
  for (bool suffix : {false, true}) {
    if (suffix && explicit_pid) break;
    const std::string path = ResolvePath(setting, pid, suffix);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return nullptr;
    // The lock says a live process writes this file; a stale file from an
    // earlier run is simply taken over.
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    if (::ftruncate(fd, 0) != 0) {
      ::close(fd);
      return nullptr;
    }
    tracer->path_ = path;
    tracer->fd_ = fd;
    break;
  }
  if (tracer->fd_ < 0) {
    errno = EBUSY;
    return nullptr;
  }
  std::vector<std::uint8_t> blocks;
  AppendSectionHeader(&blocks, "siwx (SIWX_TRACE)");
  AppendEthernetInterface(&blocks, "siwx-streams");
  tracer->WriteOut(blocks);
  return tracer;
}

Tracer* Tracer::Global() {
  static Tracer* const tracer = []() -> Tracer* {
    const char* setting = std::getenv("SIWX_TRACE");
    if (setting == nullptr || setting[0] == '\0') return nullptr;
    std::unique_ptr<Tracer> t = Open(setting);
    if (t == nullptr) {
      SIWX_LOG(kWarn, "SIWX_TRACE=%s: cannot open the trace file (%s); tracing is off. Give a "
               "writable path; \"%%p\" in it becomes the process id", setting,
               std::strerror(errno));
      return nullptr;
    }
    SIWX_LOG(kInfo, "writing the wire trace of this process to %s", t->path().c_str());
    return t.release();  // lives until exit; the kernel closes the file
  }();
  return tracer;
}

Tracer::~Tracer() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<Connection> Tracer::ConnectionOf(int fd) {
  return ConnectionOf(transport::QueryEndpoints(fd));
}

std::shared_ptr<Connection> Tracer::ConnectionOf(const transport::Endpoints& endpoints) {
  if (!endpoints.local.known() || !endpoints.peer.known() ||
      endpoints.local.family != endpoints.peer.family) {
    return nullptr;
  }
  const auto key = std::make_pair(transport::FormatEndpoint(endpoints.local),
                                  transport::FormatEndpoint(endpoints.peer));
  std::lock_guard lock(mutex_);
  std::shared_ptr<Connection>& c = connections_[key];
  if (c == nullptr) {
    c = std::make_shared<Connection>();
    c->endpoints_ = endpoints;
    c->halves_[0].isn = InitialSequence(endpoints.local, endpoints.peer);
    c->halves_[1].isn = InitialSequence(endpoints.peer, endpoints.local);
  }
  return c;
}

void Tracer::Forget(const Connection& connection) {
  std::lock_guard lock(mutex_);
  connections_.erase(std::make_pair(transport::FormatEndpoint(connection.endpoints_.local),
                                    transport::FormatEndpoint(connection.endpoints_.peer)));
}

void Tracer::Record(Connection& connection, Direction direction, std::span<const iovec> iov,
                    std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Connection::Half& half = connection.halves_[static_cast<int>(direction)];
  for (const iovec& v : iov) {
    if (bytes == 0) break;
    const std::size_t take = v.iov_len < bytes ? v.iov_len : bytes;
    const auto* base = static_cast<const std::uint8_t*>(v.iov_base);
    half.pending.insert(half.pending.end(), base, base + take);
    bytes -= take;
  }
  std::vector<std::uint8_t> out;
  EmitUnits(connection, direction, &out);
  WriteOut(out);
}

void Tracer::Record(Connection& connection, Direction direction, ByteSpan data) {
  const iovec v{const_cast<std::uint8_t*>(data.data()), data.size()};
  Record(connection, direction, std::span<const iovec>(&v, 1), data.size());
}

void Tracer::EmitUnits(Connection& c, Direction d, std::vector<std::uint8_t>* out) {
  Connection::Half& half = c.halves_[static_cast<int>(d)];
  std::size_t used = 0;
  for (;;) {
    const ByteSpan rest(half.pending.data() + used, half.pending.size() - used);
    if (rest.empty()) break;
    std::size_t unit = 0;
    if (half.phase == Connection::Phase::kStartup) {
      if (rest.size() < kStartupHeaderSize) break;
      const bool request = std::memcmp(rest.data(), kRequestKey, 16) == 0;
      const bool reply = std::memcmp(rest.data(), kReplyKey, 16) == 0;
      if (!request && !reply) {
        half.phase = Connection::Phase::kRaw;  // not MPA: pass it through
        continue;
      }
      const std::size_t private_data = static_cast<std::size_t>(rest[18] << 8 | rest[19]);
      if (rest.size() < kStartupHeaderSize + private_data) break;
      unit = kStartupHeaderSize + private_data;
      // The frame's M bit asks for markers in what its sender receives.
      c.halves_[static_cast<int>(Other(d))].markers = (rest[16] & kMarkerFlag) != 0;
      if (!c.started_ && request) EmitHandshake(c, d, out);
      half.phase = Connection::Phase::kFpdus;
      half.full_operation_start = half.emitted + unit;
    } else if (half.phase == Connection::Phase::kFpdus) {
      unit = CompleteFpduLength(rest, half.markers, half.emitted - half.full_operation_start);
      if (unit == 0) break;
    } else {
      unit = rest.size();
    }
    EmitPacket(c, d, rest.first(unit), kTcpAck | kTcpPsh, out);
    used += unit;
  }
  half.pending.erase(half.pending.begin(),
                     half.pending.begin() + static_cast<std::ptrdiff_t>(used));
}

void Tracer::EmitPacket(Connection& c, Direction d, ByteSpan payload, std::uint8_t flags,
                        std::vector<std::uint8_t>* out) {
  Connection::Half& half = c.halves_[static_cast<int>(d)];
  const Connection::Half& other = c.halves_[static_cast<int>(Other(d))];
  TcpSegment s;
  s.source = d == Direction::kSent ? c.endpoints_.local : c.endpoints_.peer;
  s.destination = d == Direction::kSent ? c.endpoints_.peer : c.endpoints_.local;
  // Data starts one after the ISN (the SYN's).
  s.seq = half.isn + 1 + static_cast<std::uint32_t>(half.emitted);
  s.ack = other.isn + 1 + static_cast<std::uint32_t>(other.emitted);
  s.flags = flags;
  s.payload = payload;
  s.timestamp_us = NowMicros();
  AppendEnhancedPacket(out, BuildTcpFrame(s), s.timestamp_us);
  half.emitted += payload.size();
  c.started_ = true;
}

void Tracer::EmitHandshake(Connection& c, Direction requester, std::vector<std::uint8_t>* out) {
  const Direction responder = Other(requester);
  auto endpoint_of = [&c](Direction d) {
    return d == Direction::kSent ? c.endpoints_.local : c.endpoints_.peer;
  };
  const std::uint64_t now = NowMicros();
  auto emit = [&](Direction from, std::uint32_t seq, std::uint32_t ack, std::uint8_t flags) {
    TcpSegment s;
    s.source = endpoint_of(from);
    s.destination = endpoint_of(Other(from));
    s.seq = seq;
    s.ack = ack;
    s.flags = flags;
    s.timestamp_us = now;
    AppendEnhancedPacket(out, BuildTcpFrame(s), now);
  };
  const std::uint32_t req_isn = c.halves_[static_cast<int>(requester)].isn;
  const std::uint32_t rsp_isn = c.halves_[static_cast<int>(responder)].isn;
  emit(requester, req_isn, 0, kTcpSyn);
  emit(responder, rsp_isn, req_isn + 1, kTcpSyn | kTcpAck);
  emit(requester, req_isn + 1, rsp_isn + 1, kTcpAck);
  c.started_ = true;
}

void Tracer::WriteOut(const std::vector<std::uint8_t>& blocks) {
  std::size_t done = 0;
  while (done < blocks.size() && !write_failed_) {
    const ssize_t n = ::write(fd_, blocks.data() + done, blocks.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      write_failed_ = true;
      SIWX_LOG(kWarn, "SIWX_TRACE: writing %s failed (%s); the trace ends here",
               path_.c_str(), std::strerror(errno));
      break;
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace siwx::trace
