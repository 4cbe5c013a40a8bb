// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Shared pieces of the engine tests: connected socket pairs, an engine
// "node" (engine + PD + CQs + QP + collected async events), registered
// buffers with guard octets, completion waits, and a raw wire peer that
// speaks FPDUs through the wire codecs so tests can inject exact bytes and
// decode exactly what the engine sent.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/completion.h"
#include "common/engine/engine.h"
#include "common/engine/memory.h"
#include "common/engine/qp.h"
#include "common/engine/receive_queue.h"
#include "common/engine/stream_params.h"
#include "common/engine/work_request.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/fpdu.h"
#include "common/wire/fpdu_parser.h"
#include "common/wire/terminate.h"

namespace siwx::engine::testing {

using Clock = std::chrono::steady_clock;
inline constexpr std::chrono::seconds kWait{20};

enum class Transport { kSocketPair, kTcp };

inline std::string TransportName(Transport t) { return t == Transport::kTcp ? "Tcp" : "SocketPair"; }

// A connected pair of stream sockets: {a, b}.
inline std::array<int, 2> Connect(Transport transport) {
  std::array<int, 2> fds{-1, -1};
  if (transport == Transport::kSocketPair) {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
    return fds;
  }
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(listen(listener, 1), 0);
  EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(fds[0], reinterpret_cast<sockaddr*>(&addr), len), 0);
  fds[1] = accept(listener, nullptr, nullptr);
  close(listener);
  return fds;
}

// A byte pattern that differs per buffer and per position.
inline std::uint8_t PatternByte(std::uint32_t seed, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFF);
}

// A buffer with `guard` octets of 0xEE on both sides of a `size`-octet body,
// optionally registered (covering the body only, or body plus guards).
class Buffer {
 public:
  static constexpr std::uint8_t kGuard = 0xEE;
  static constexpr std::size_t kGuardSize = 64;

  explicit Buffer(std::size_t size, std::uint8_t fill = 0)
      : size_(size), bytes_(size + 2 * kGuardSize, kGuard) {
    std::fill(bytes_.begin() + kGuardSize, bytes_.end() - kGuardSize, fill);
  }
  std::uint8_t* data() { return bytes_.data() + kGuardSize; }
  const std::uint8_t* data() const { return bytes_.data() + kGuardSize; }
  std::size_t size() const { return size_; }
  std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(data()); }
  void Fill(std::uint32_t seed) {
    for (std::size_t i = 0; i < size_; ++i) data()[i] = PatternByte(seed, i);
  }
  bool GuardsIntact() const {
    for (std::size_t i = 0; i < kGuardSize; ++i) {
      if (bytes_[i] != kGuard || bytes_[kGuardSize + size_ + i] != kGuard) return false;
    }
    return true;
  }
  // Registers the body (and, with `with_guards`, the guards too).
  std::uint32_t Register(MemoryTable& table, PdId pd, AccessFlags access, bool with_guards = false) {
    const std::uintptr_t host = reinterpret_cast<std::uintptr_t>(
        with_guards ? bytes_.data() : data());
    const std::size_t length = with_guards ? bytes_.size() : std::max<std::size_t>(size_, 1);
    const RegisterResult r = table.Register(pd, host, length, host, access);
    EXPECT_EQ(r.status, RegisterStatus::kOk);
    stag_ = r.stag;
    table_ = &table;
    return r.stag;
  }
  std::uint32_t stag() const { return stag_; }
  ~Buffer() {
    if (table_ != nullptr && stag_ != 0) table_->Deregister(stag_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

 private:
  std::size_t size_;
  std::vector<std::uint8_t> bytes_;
  std::uint32_t stag_ = 0;
  MemoryTable* table_ = nullptr;
};

inline constexpr AccessFlags kAllRemote =
    AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite | AccessFlags::kRemoteRead;

// Collects async events from an engine.
class EventLog {
 public:
  AsyncEventCallback Callback() {
    return [this](const AsyncEvent& e) {
      std::lock_guard lock(mutex_);
      events_.push_back(e);
    };
  }
  std::vector<AsyncEvent> Events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  bool Has(AsyncEventType type) const {
    std::lock_guard lock(mutex_);
    for (const AsyncEvent& e : events_) {
      if (e.type == type) return true;
    }
    return false;
  }
  bool WaitFor(AsyncEventType type, std::chrono::milliseconds timeout = kWait) const {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (Has(type)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Has(type);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<AsyncEvent> events_;
};

// Polls `cq` until `n` completions arrived or the deadline passed.
inline std::vector<WorkCompletion> WaitCompletions(CompletionQueue& cq, std::size_t n,
                                                   std::chrono::milliseconds timeout = kWait) {
  std::vector<WorkCompletion> out;
  const auto deadline = Clock::now() + timeout;
  std::array<WorkCompletion, 16> batch;
  while (out.size() < n && Clock::now() < deadline) {
    const std::size_t got = cq.Poll(std::span<WorkCompletion>(batch.data(),
                                                             std::min(batch.size(), n - out.size())));
    out.insert(out.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(got));
    if (got == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return out;
}

// Polls with progress until `n` completions arrived or the deadline passed.
inline std::vector<WorkCompletion> PollProgressFor(CompletionQueue& cq, std::size_t n,
                                                   std::chrono::milliseconds timeout = kWait) {
  std::vector<WorkCompletion> out;
  const auto deadline = Clock::now() + timeout;
  std::array<WorkCompletion, 16> batch;
  while (out.size() < n && Clock::now() < deadline) {
    const std::size_t got = cq.PollWithProgress(
        std::span<WorkCompletion>(batch.data(), std::min(batch.size(), n - out.size())));
    out.insert(out.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(got));
  }
  return out;
}

// True if nothing arrives on `cq` for `quiet`.
inline bool StaysEmpty(CompletionQueue& cq, std::chrono::milliseconds quiet) {
  std::this_thread::sleep_for(quiet);
  return cq.size() == 0;
}

// The event mask of the entry of epoll fd `epoll_fd` whose data is
// `cookie` (the engine's poller registers each QP's socket with the QP's
// address), read from /proc/self/fdinfo; nullopt if there is none.
inline std::optional<std::uint32_t> PollerMaskOf(int epoll_fd, const void* cookie) {
  const std::string path = "/proc/self/fdinfo/" + std::to_string(epoll_fd);
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return std::nullopt;
  std::optional<std::uint32_t> mask;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    int tfd = 0;
    unsigned events = 0;
    unsigned long long data = 0;
    // "tfd: %8d events: %8x data: %16llx ..." (fs/eventpoll.c's fdinfo)
    if (std::sscanf(line, "tfd: %d events: %x data: %llx", &tfd, &events, &data) == 3 &&
        data == reinterpret_cast<std::uintptr_t>(cookie)) {
      mask = events;
    }
  }
  std::fclose(f);
  return mask;
}

template <typename Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout = kWait) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return pred();
}

struct NodeOptions {
  QueueCaps sq_caps{256, kMaxSge, kMaxInlineData};
  QueueCaps rq_caps{256, kMaxSge, 0};
  std::uint32_t cq_depth = 4096;
  bool sq_sig_all = false;
  ReceiveQueue* srq = nullptr;
  std::chrono::milliseconds teardown_timeout = kDefaultTeardownTimeout;  // own engine only
  ProgressAffinity progress_affinity = ProgressAffinity::kAway;           // own engine only
  std::chrono::microseconds responder_spin = ResponderSpin::kDefaultMax;  // own engine only
  std::size_t tx_coalesce_octets = kDefaultTxCoalesceOctets;              // own engine only
  std::chrono::microseconds answer_spin = kDefaultAnswerSpin;             // own engine only
  PdId pd = kNoPd;  // kNoPd: allocate one; else a PD of the shared engine
};

// One side: an engine (own or shared), a PD, two CQs and one QP in INIT.
struct Node {
  explicit Node(NodeOptions options = {}, Engine* shared_engine = nullptr) {
    if (shared_engine == nullptr) {
      EngineConfig config;
      config.on_async_event = events.Callback();
      config.teardown_timeout = options.teardown_timeout;
      config.progress_affinity = options.progress_affinity;
      config.responder_spin = options.responder_spin;
      config.tx_coalesce_octets = options.tx_coalesce_octets;
      config.answer_spin = options.answer_spin;
      own_engine = Engine::Create(std::move(config));
      engine = own_engine.get();
    } else {
      engine = shared_engine;
    }
    pd = options.pd != kNoPd ? options.pd : engine->memory().AllocatePd();
    CompletionQueue::Callbacks scb;
    send_cq = CompletionQueue::Create(options.cq_depth, scb);
    CompletionQueue::Callbacks rcb;
    rcb.on_completion = [this] { recv_notifications.fetch_add(1); };
    recv_cq = CompletionQueue::Create(options.cq_depth, rcb);
    QpConfig config;
    config.pd = pd;
    config.send_cq = send_cq.get();
    config.recv_cq = recv_cq.get();
    config.srq = options.srq;
    config.sq_caps = options.sq_caps;
    config.rq_caps = options.rq_caps;
    config.sq_sig_all = options.sq_sig_all;
    qp = engine->CreateQp(config);
    EXPECT_NE(qp, nullptr);
    EXPECT_EQ(qp->Modify(QpState::kInit), QpStatus::kOk);
  }
  ~Node() {
    if (qp) qp->Destroy();
    qp.reset();
    own_engine.reset();
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  MemoryTable& memory() { return engine->memory(); }
  void Bind(int fd, const StreamParams& params) {
    ASSERT_EQ(qp->Bind(std::make_unique<transport::TcpStream>(fd), params), BindStatus::kOk);
  }

  EventLog events;
  std::unique_ptr<Engine> own_engine;
  Engine* engine = nullptr;
  PdId pd = kNoPd;
  std::unique_ptr<CompletionQueue> send_cq;
  std::unique_ptr<CompletionQueue> recv_cq;
  std::atomic<int> recv_notifications{0};
  std::shared_ptr<Qp> qp;
};

// Parameters for the two directions of a connection between a and b.
struct LinkOptions {
  bool crc = false;
  bool markers = false;
  std::uint32_t ird = 8;
  std::uint32_t ord = 8;
  std::size_t max_ulpdu = 0;
  bool large_fpdus = false;
};

inline StreamParams ParamsFor(const LinkOptions& o) {
  StreamParams p;
  p.crc_enabled = o.crc;
  p.tx_markers = o.markers;
  p.rx_markers = o.markers;
  p.ird = o.ird;
  p.ord = o.ord;
  p.max_ulpdu = o.max_ulpdu;
  p.large_fpdus = o.large_fpdus;
  return p;
}

inline void Link(Node& a, Node& b, Transport transport, const LinkOptions& o) {
  const std::array<int, 2> fds = Connect(transport);
  a.Bind(fds[0], ParamsFor(o));
  b.Bind(fds[1], ParamsFor(o));
}

inline SendWorkRequest MakeSend(std::uint64_t wr_id, SendOpcode opcode, std::uint32_t flags = kSendSignaled) {
  SendWorkRequest wr;
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.flags = flags;
  return wr;
}

inline void AddSge(SendWorkRequest& wr, std::uint64_t addr, std::uint32_t length, std::uint32_t lkey) {
  wr.sge[wr.num_sge++] = Sge{addr, length, lkey};
}
inline void AddSge(ReceiveWorkRequest& wr, std::uint64_t addr, std::uint32_t length, std::uint32_t lkey) {
  wr.sge[wr.num_sge++] = Sge{addr, length, lkey};
}

// Posts one receive WR of the whole buffer on n's QP.
inline void PostRecv(Node& n, std::uint64_t id, Buffer& buf, std::uint32_t key) {
  ReceiveWorkRequest rwr;
  rwr.wr_id = id;
  AddSge(rwr, buf.addr(), static_cast<std::uint32_t>(buf.size()), key);
  ASSERT_EQ(n.qp->PostRecv(rwr), PostStatus::kOk);
}

// Splits [addr, addr + size) into `parts` SGEs (the last takes the rest).
template <typename Wr>
void AddSplitSges(Wr& wr, std::uint64_t addr, std::size_t size, std::uint32_t lkey, std::size_t parts) {
  if (size == 0 || parts <= 1) {
    AddSge(wr, addr, static_cast<std::uint32_t>(size), lkey);
    return;
  }
  parts = std::min(parts, size);
  const std::size_t step = size / parts;
  std::size_t at = 0;
  for (std::size_t i = 0; i < parts; ++i) {
    const std::size_t n = i + 1 == parts ? size - at : step;
    AddSge(wr, addr + at, static_cast<std::uint32_t>(n), lkey);
    at += n;
  }
}

// Holds an engine's progress thread: a QP of that engine whose receive CQ's
// notification callback (which runs on the progress thread) waits until
// Release. Its peer lives on another engine.
class ProgressThreadBlocker {
 public:
  ProgressThreadBlocker(Node& victim, Engine* peer_engine) : peer_(NodeOptions{}, peer_engine) {
    CompletionQueue::Callbacks callbacks;
    callbacks.on_completion = [this] {
      std::unique_lock lock(mutex_);
      blocked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
    };
    cq_ = CompletionQueue::Create(16, std::move(callbacks));
    QpConfig config;
    config.pd = victim.pd;
    config.send_cq = cq_.get();
    config.recv_cq = cq_.get();
    config.sq_caps = QueueCaps{16, kMaxSge, kMaxInlineData};
    config.rq_caps = QueueCaps{16, kMaxSge, 0};
    qp_ = victim.engine->CreateQp(config);
    EXPECT_NE(qp_, nullptr);
    EXPECT_EQ(qp_->Modify(QpState::kInit), QpStatus::kOk);
    const std::array<int, 2> fds = Connect(Transport::kSocketPair);
    peer_.Bind(fds[0], StreamParams{});
    EXPECT_EQ(qp_->Bind(std::make_unique<transport::TcpStream>(fds[1]), StreamParams{}),
              BindStatus::kOk);
  }
  ~ProgressThreadBlocker() {
    Release();
    if (qp_) qp_->Destroy();
  }

  // Returns once the victim's progress thread is held in the callback.
  bool Block() {
    ReceiveWorkRequest rwr;
    rwr.wr_id = 1;
    if (qp_->PostRecv(rwr) != PostStatus::kOk) return false;
    cq_->Arm(CqArm::kNextCompletion);
    if (peer_.qp->PostSend(MakeSend(1, SendOpcode::kSend, 0)) != PostStatus::kOk) return false;
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, kWait, [this] { return blocked_; });
  }
  bool blocked() {
    std::lock_guard lock(mutex_);
    return blocked_ && !released_;
  }
  void Release() {
    std::lock_guard lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  Node peer_;
  std::unique_ptr<CompletionQueue> cq_;
  std::shared_ptr<Qp> qp_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool blocked_ = false;   // guarded by mutex_
  bool released_ = false;  // guarded by mutex_
};

inline ::testing::AssertionResult SameBytes(const std::uint8_t* got, const std::uint8_t* want,
                                            std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure() << "first difference at octet " << i << " of " << n
                                           << ": got " << int{got[i]} << " want " << int{want[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- Raw wire peer ----

// One message (or segment) the raw peer received.
struct WireSegment {
  rdmap::HeaderDecodeResult decoded;
  std::vector<std::uint8_t> header;   // raw ULPDU header octets
  std::vector<std::uint8_t> payload;
  std::uint16_t ulpdu_length = 0;
  std::vector<std::uint8_t> wire;     // the whole FPDU as read (markers included)
};

// Collects what an FpduParser delivers: one WireSegment per good FPDU, and
// the MPA error that stopped it, if any.
class WireCollector : public mpa::FpduListener {
 public:
  void OnFpduHeader(const mpa::FpduHeaderInfo& h) override {
    current_ = WireSegment{};
    current_.header.assign(h.header.begin(), h.header.end());
    current_.decoded = rdmap::DecodeDdpRdmapHeader(h.header);
    current_.ulpdu_length = h.ulpdu_length;
  }
  void OnPayload(std::size_t, ByteSpan octets) override {
    current_.payload.insert(current_.payload.end(), octets.begin(), octets.end());
  }
  void OnFpduComplete(const mpa::FpduCompletion&) override { segments.push_back(current_); }
  void OnError(mpa::MpaError e) override { error = e; }

  std::vector<WireSegment> segments;
  mpa::MpaError error = mpa::MpaError::kNone;

 private:
  WireSegment current_;
};

// Whether a segment is a well-formed Terminate message.
inline bool IsTerminate(const WireSegment& seg) {
  return seg.decoded.status == rdmap::HeaderStatus::kOk &&
         seg.decoded.header.opcode == rdmap::Opcode::kTerminate;
}

// The Terminate header a Terminate segment carries (RFC 5040 4.8), decoded.
inline std::optional<rdmap::TerminateHeader> DecodeTerminateSegment(const WireSegment& seg) {
  if (!IsTerminate(seg) || seg.header.size() < rdmap::kDdpUntaggedHeaderSize) return std::nullopt;
  std::vector<std::uint8_t> body(seg.header.begin() + rdmap::kDdpUntaggedHeaderSize, seg.header.end());
  body.insert(body.end(), seg.payload.begin(), seg.payload.end());
  const rdmap::TerminateDecodeResult r = rdmap::DecodeTerminateHeader(body);
  EXPECT_EQ(r.status, rdmap::TerminateStatus::kOk);
  if (r.status != rdmap::TerminateStatus::kOk) return std::nullopt;
  return r.header;
}

// Parses a recorded one-direction stream from its first octet.
struct ParsedWire {
  std::vector<WireSegment> segments;
  mpa::MpaError error = mpa::MpaError::kNone;
  std::size_t consumed = 0;  // octets the parser took
};
inline ParsedWire ParseWire(ByteSpan stream, bool crc, bool markers) {
  mpa::FpduParser parser(mpa::FpduParserConfig{crc, markers, 0, &rdmap::UlpduHeaderLength});
  WireCollector collector;
  ParsedWire out;
  out.consumed = parser.Feed(stream, collector);
  out.segments = std::move(collector.segments);
  out.error = collector.error;
  return out;
}

// Open file descriptors of this process (the directory handle used to
// count them included, the same in every call).
inline std::size_t OpenFdCount() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::size_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Aborts the process with `what` if it is still armed after `limit`: a test
// that would hang fails instead (ctest reports the abort and the message).
// The constructor returns once the thread runs: under ASan a starting
// thread opens and closes a pipe (the runtime probing memory), and an
// OpenFdCount taken meanwhile counted those two descriptors.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock lock(mutex_);
      running_ = true;
      cv_.notify_all();
      if (!cv_.wait_for(lock, limit, [this] { return disarmed_; })) {
        std::fprintf(stderr, "WATCHDOG: %s did not finish within %lld s\n", what_.c_str(),
                     static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::abort();
      }
    });
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return running_; });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      disarmed_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool running_ = false;
  bool disarmed_ = false;
  std::thread thread_;
};

// A test peer on a blocking socket: frames ULPDUs with FpduFramer, parses
// what the engine sends with FpduParser.
class RawPeer {
 public:
  RawPeer(int fd, bool crc, bool markers) : fd_(fd),
        framer_(mpa::FpduFramingConfig{crc, markers, 0}),
        parser_(mpa::FpduParserConfig{crc, markers, 0, &rdmap::UlpduHeaderLength}) {}
  ~RawPeer() {
    if (fd_ >= 0) close(fd_);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  int fd() const { return fd_; }

  // Frames and writes one ULPDU (header + payload).
  void SendUlpdu(ByteSpan header, ByteSpan payload = {}) {
    mpa::FpduFrame frame;
    const std::array<ByteSpan, 1> pieces{payload};
    ASSERT_EQ(framer_.Frame(header, std::span<const ByteSpan>(pieces.data(), payload.empty() ? 0 : 1),
                            frame),
              mpa::FrameStatus::kOk);
    std::vector<std::uint8_t> wire;
    for (const mpa::IoSlice& s : frame.slices()) wire.insert(wire.end(), s.base, s.base + s.len);
    WriteAll(wire);
  }
  // Frames one FPDU into `out` without writing it (the grid advances as if
  // it had been sent).
  void FrameTo(const rdmap::DdpRdmapHeader& h, ByteSpan payload, std::vector<std::uint8_t>& out) {
    std::array<std::uint8_t, 128> buf{};
    const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(h, buf);
    ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
    mpa::FpduFrame frame;
    const std::array<ByteSpan, 1> pieces{payload};
    ASSERT_EQ(framer_.Frame(ByteSpan(buf.data(), r.length),
                            std::span<const ByteSpan>(pieces.data(), payload.empty() ? 0 : 1), frame),
              mpa::FrameStatus::kOk);
    for (const mpa::IoSlice& sl : frame.slices()) out.insert(out.end(), sl.base, sl.base + sl.len);
  }
  void SendHeader(const rdmap::DdpRdmapHeader& h, ByteSpan payload = {}) {
    std::array<std::uint8_t, 128> buf{};
    const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(h, buf);
    ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
    SendUlpdu(ByteSpan(buf.data(), r.length), payload);
  }
  void WriteAll(ByteSpan bytes) {
    std::size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << "send failed: " << std::strerror(errno);
      at += static_cast<std::size_t>(n);
    }
  }

  // Reads until `pred(segments)` holds, EOF, or the timeout. Returns true if
  // pred held.
  template <typename Pred>
  bool ReadUntil(Pred pred, std::chrono::milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    std::vector<std::uint8_t> buf(64 * 1024);
    while (!pred(collector_.segments)) {
      if (eof_) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t n = recv(fd_, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        eof_ = true;
        continue;
      }
      if (n < 0) continue;
      bytes_read_ += static_cast<std::size_t>(n);
      raw_.insert(raw_.end(), buf.begin(), buf.begin() + n);
      parser_.Feed(ByteSpan(buf.data(), static_cast<std::size_t>(n)), collector_);
    }
    return true;
  }
  bool WaitSegments(std::size_t n, std::chrono::milliseconds timeout = kWait) {
    return ReadUntil([n](const std::vector<WireSegment>& s) { return s.size() >= n; }, timeout);
  }
  // The Terminate among what was received, decoded.
  std::optional<rdmap::TerminateHeader> WaitTerminate(std::chrono::milliseconds timeout = kWait) {
    ReadUntil([](const std::vector<WireSegment>& s) {
      return std::any_of(s.begin(), s.end(), IsTerminate);
    }, timeout);
    for (const WireSegment& seg : segments()) {
      if (IsTerminate(seg)) return DecodeTerminateSegment(seg);
    }
    return std::nullopt;
  }
  // True once the engine closed its side (FIN or RST).
  bool WaitEof(std::chrono::milliseconds timeout = kWait) {
    ReadUntil([](const std::vector<WireSegment>&) { return false; }, timeout);
    return eof_;
  }
  // Drains what is readable without blocking for long.
  void Pump(std::chrono::milliseconds timeout) {
    ReadUntil([](const std::vector<WireSegment>&) { return false; }, timeout);
  }

  const std::vector<WireSegment>& segments() const { return collector_.segments; }
  const std::vector<std::uint8_t>& raw() const { return raw_; }
  bool eof() const { return eof_; }
  mpa::MpaError parse_error() const { return collector_.error; }

  mpa::FpduFramer& framer() { return framer_; }

 private:
  int fd_;
  mpa::FpduFramer framer_;
  mpa::FpduParser parser_;
  WireCollector collector_;
  std::vector<std::uint8_t> raw_;
  std::size_t bytes_read_ = 0;
  bool eof_ = false;
};

// Header builders for the raw peer.
inline rdmap::DdpRdmapHeader WriteHeader(std::uint32_t stag, std::uint64_t to, bool last = true) {
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kRdmaWrite, last);
  h.stag = stag;
  h.to = to;
  return h;
}
inline rdmap::DdpRdmapHeader SendHeaderOf(std::uint32_t msn, std::uint32_t mo, bool last = true,
                                          rdmap::Opcode op = rdmap::Opcode::kSend) {
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(op, last);
  h.msn = msn;
  h.mo = mo;
  return h;
}
inline rdmap::DdpRdmapHeader ReadRequestOf(std::uint32_t msn, const rdmap::ReadRequestBody& body) {
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadRequest, true);
  h.msn = msn;
  h.body = body;
  return h;
}

// A Node bound to one end of a connection whose other end is a RawPeer.
struct RawLink {
  RawLink(Node& node, const LinkOptions& o, Transport transport = Transport::kSocketPair,
          StreamParams params_override = {}, bool use_override = false) {
    const std::array<int, 2> fds = Connect(transport);
    StreamParams p = use_override ? params_override : ParamsFor(o);
    node.Bind(fds[0], p);
    peer = std::make_unique<RawPeer>(fds[1], o.crc, o.markers);
  }
  std::unique_ptr<RawPeer> peer;
};

}  // namespace siwx::engine::testing
