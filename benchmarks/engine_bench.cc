// Engine benchmark (issue 3): the siwx engine against the kernel TCP stream it
// runs over, measured side by side in one run on loopback.
//
//   build/release/benchmarks/engine_bench [--reps=5] [--seconds=2] [--quick]
//
// Rows (each repeated --reps times, round-robin, so that every siwx figure
// has TCP figures taken seconds before it; ratios are medians of those
// per-round ratios, docs/performance-notes.md 1):
//  1. TCP stream, 64 KiB blocking writes, a sender and a receiver thread,
//     TCP_NODELAY; (1b) the same with 1 MiB writes, for scale: loopback TCP
//     is much faster with large writes, and one siwx sendmsg carries a batch
//     of FPDUs of about that size.
//  2. siwx RDMA Write stream, 64 KiB messages, two Engines (one per side, as
//     two processes would have) over one loopback TCP connection: MULPDU from
//     the EMSS (the interoperable default; on loopback the EMSS at connect
//     time is about 32 KiB), large FPDUs (siwx to siwx), and, for scale, the
//     MULPDU a hardware peer on Ethernet would ask for; CRC off and on. The
//     application thread keeps a window of Writes posted, every Nth one
//     signaled, and busy-polls the send CQ as ib_write_bw does (or, with
//     --use-event, sleeps until the armed CQ fires).
//  3. TCP ping-pong, 8 B, blocking sockets; (3b) the "same threading" variant
//     of performance-notes.md 3 (the application spins on memory, an agent thread
//     blocked in recv() writes to it: the fair comparison for 4); (3c) both
//     ends busy-polling recv (the floor).
//  4. siwx 8 B RDMA Write ping-pong as ib_write_lat does it: the application
//     spins on the last byte of its own buffer, posts an inline Write into
//     the peer's buffer and polls for its send completion; only the engines'
//     progress threads place data.
//  5. CPU: process CPU time (getrusage, all threads of both ends) per GB and
//     per message or round trip, next to each figure; the diagnostics table
//     adds the application thread's own CPU and the engine's QP counters.
// Every siwx stream run ends with a data check (the target must hold the
// last pattern written, fenced by a Send); a run that fails it, stalls or
// sees an error reports FAIL instead of a figure and the program exits 1.
//
// "foreign" is the CPU other processes used during the measurement (cores),
// from /proc/stat minus our own getrusage, as in performance-notes.md 1. On this
// 2-vCPU host the figures move a lot with foreign load and with where the
// scheduler puts the threads (sender and receiver on one vCPU halve a
// stream), so read medians of several rounds, never one round.
//
// A benchmark, never a test: it prints figures and judges nothing but data
// integrity.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/engine/completion.h"
#include "common/engine/engine.h"
#include "common/engine/memory.h"
#include "common/engine/qp.h"
#include "common/engine/stream_params.h"
#include "common/engine/work_request.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/fpdu.h"

namespace siwx::bench {
namespace {

using Clock = std::chrono::steady_clock;
using engine::AccessFlags;
using engine::PostStatus;
using engine::SendOpcode;
using engine::SendWorkRequest;
using engine::WcStatus;
using engine::WorkCompletion;

constexpr std::size_t kLatencySize = 8;  // ib_write_lat -s 8
// A run that makes no progress for this long is declared stalled.
constexpr std::chrono::seconds kStallTimeout{10};
// Ethernet EMSS (1500 MTU, TCP timestamps): the MULPDU a hardware peer wants.
constexpr std::size_t kEthernetEmss = 1448;
// The second TCP reference: about what one siwx sendmsg carries when the
// socket has room (a batch of FPDUs), and where loopback TCP peaks.
constexpr std::size_t kLargeWriteSize = std::size_t{1} << 20;

struct Options {
  int reps = 5;
  double seconds = 2.0;       // measured part of each stream run
  double warmup = 0.25;       // unmeasured start of each stream run
  std::size_t msg_size = 64 * 1024;
  std::uint32_t window = 128;       // outstanding Writes (ib_write_bw tx-depth)
  std::uint32_t signal_every = 16;  // every Nth Write is signaled
  std::uint32_t lat_iters = 20000;  // round trips per latency run (at most)
  double lat_seconds = 3.0;         // time limit of one latency run
  bool run_bw = true;
  bool run_lat = true;
  bool ethernet_rows = true;
  bool progress_in_poll = false;  // poll loop gives the transmit side a turn
  bool use_event = false;         // stream poll loop sleeps on CQ events instead of spinning
  std::string filter;             // run only siwx stream rows whose label has it
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---------------------------------------------------------------------------
// Statistics

struct Summary {
  bool valid = false;
  double median = 0, min = 0, max = 0;
};

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.valid = true;
  s.min = v.front();
  s.max = v.back();
  const std::size_t n = v.size();
  s.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const std::size_t at =
      std::min(sorted.size() - 1, static_cast<std::size_t>(p * static_cast<double>(sorted.size())));
  return sorted[at];
}

// ---------------------------------------------------------------------------
// CPU and machine load

struct CpuSnapshot {
  Clock::time_point wall;
  double own_cpu_s = 0;                // getrusage(RUSAGE_SELF) user + sys
  std::uint64_t context_switches = 0;  // getrusage voluntary + involuntary
  std::uint64_t machine_busy_ticks = 0;  // /proc/stat user+nice+system+irq+softirq
};

// Tick-sampled (the kernel here uses tick accounting), so short runs that
// sleep and wake often read low; irq and softirq count because a tick in a
// softirq is also charged to the interrupted task's system time.
std::uint64_t MachineBusyTicks() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  std::uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq) ||
      cpu != "cpu") {
    return 0;
  }
  return user + nice + system + irq + softirq;
}

CpuSnapshot TakeCpuSnapshot() {
  CpuSnapshot s;
  s.machine_busy_ticks = MachineBusyTicks();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  s.own_cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  s.context_switches = static_cast<std::uint64_t>(ru.ru_nvcsw + ru.ru_nivcsw);
  s.wall = Clock::now();
  return s;
}

struct CpuUse {
  double wall_s = 0;
  double own_cpu_s = 0;
  double foreign_cores = 0;  // other processes, averaged over the interval
  double context_switches = 0;
};

CpuUse CpuBetween(const CpuSnapshot& a, const CpuSnapshot& b) {
  CpuUse u;
  u.wall_s = Seconds(b.wall - a.wall);
  u.own_cpu_s = b.own_cpu_s - a.own_cpu_s;
  u.context_switches = static_cast<double>(b.context_switches - a.context_switches);
  const double ticks_per_s = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double machine_s =
      static_cast<double>(b.machine_busy_ticks - a.machine_busy_ticks) / ticks_per_s;
  if (u.wall_s > 0) u.foreign_cores = (machine_s - u.own_cpu_s) / u.wall_s;
  return u;
}

// CPU time of the calling thread.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string line;
  std::getline(f, line);
  return line;
}

// ---------------------------------------------------------------------------
// Buffers and patterns

// Page-aligned, zero-filled memory (what ib_write_bw registers).
class PageBuffer {
 public:
  explicit PageBuffer(std::size_t size) : size_(size) {
    const std::size_t rounded = (std::max<std::size_t>(size, 1) + 4095) / 4096 * 4096;
    data_ = static_cast<std::uint8_t*>(std::aligned_alloc(4096, rounded));
    if (data_ == nullptr) {
      std::fprintf(stderr, "engine_bench: out of memory\n");
      std::exit(2);
    }
    std::memset(data_, 0, rounded);
  }
  ~PageBuffer() { std::free(data_); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  std::uint8_t* data() { return data_; }
  std::size_t size() const { return size_; }
  std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(data_); }

 private:
  std::size_t size_;
  std::uint8_t* data_ = nullptr;
};

std::uint8_t PatternByte(std::uint32_t seed, std::size_t i) {
  return static_cast<std::uint8_t>(((i ^ (i >> 8)) * 167 + seed * 61 + (i >> 16)) & 0xFF);
}

void FillPattern(PageBuffer& b, std::uint32_t seed, std::uint8_t flip) {
  for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = PatternByte(seed, i) ^ flip;
}

// Offset of the first octet that differs from the pattern, or nullopt.
std::optional<std::size_t> FirstMismatch(PageBuffer& b, std::uint32_t seed, std::uint8_t flip) {
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b.data()[i] != (PatternByte(seed, i) ^ flip)) return i;
  }
  return std::nullopt;
}

// Reads a byte the peer's engine writes behind our back (ib_write_lat's
// `volatile` poll). The engine's copy is not atomic; a single octet cannot
// tear.
std::uint8_t SpinLoad(std::uint8_t& octet) {
  return std::atomic_ref<std::uint8_t>(octet).load(std::memory_order_acquire);
}

// ---------------------------------------------------------------------------
// Sockets

void SetTimeouts(int fd) {
  timeval tv{};
  tv.tv_sec = kStallTimeout.count();
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// A connected loopback TCP pair {client, server}: blocking, TCP_NODELAY.
// {-1, -1} on failure.
std::array<int, 2> ConnectLoopback() {
  std::array<int, 2> fds{-1, -1};
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return fds;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if (bind(listener, sa, len) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, sa, &len) != 0) {
    close(listener);
    return fds;
  }
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (client < 0 || connect(client, sa, len) != 0) {
    if (client >= 0) close(client);
    close(listener);
    return fds;
  }
  const int server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  close(listener);
  if (server < 0) {
    close(client);
    return fds;
  }
  const int one = 1;
  for (int fd : {client, server}) {
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  fds = {client, server};
  return fds;
}

bool SendAll(int fd, const std::uint8_t* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool RecvAll(int fd, std::uint8_t* p, std::size_t n, int flags = 0) {
  const auto stall_at = Clock::now() + kStallTimeout;
  std::uint32_t spins = 0;
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, flags);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && (flags & MSG_DONTWAIT) != 0) {
      if ((++spins & 0xFFF) == 0 && Clock::now() > stall_at) return false;
      continue;
    }
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Results

struct BwResult {
  bool ok = false;
  std::string error;
  double gbps = 0;
  double cpu_s_per_gb = 0;     // core-seconds per GB (10^9 octets) moved
  double cpu_us_per_msg = 0;
  double cores = 0;            // our CPU use during the window
  double app_cores = 0;        // siwx: the posting/polling application thread alone
  double switches_per_msg = 0; // context switches of all our threads per message
  double foreign_cores = 0;
  // siwx only: engine counters over the window.
  std::size_t max_ulpdu = 0;
  double fpdus_per_msg = 0;
  double fpdus_per_sendmsg = 0;
  double tx_would_block_per_msg = 0;
  double rx_syscalls_per_fpdu = 0;
  double rx_staged_fraction = 0;
};

struct LatResult {
  bool ok = false;
  std::string error;
  double median_us = 0;  // half round trip
  double p99_us = 0;
  std::size_t samples = 0;  // round trips measured (after the warm-up)
  double cpu_us_per_rtt = 0;
  double foreign_cores = 0;
};

BwResult Failed(std::string why) {
  BwResult r;
  r.error = std::move(why);
  return r;
}

LatResult LatFailed(std::string why) {
  LatResult r;
  r.error = std::move(why);
  return r;
}

// Half round trips (us) from the client's timestamps, warm-up dropped (at
// most a tenth of what completed, for runs the time limit cut short).
LatResult LatFromTimestamps(const std::vector<Clock::time_point>& t, std::size_t warmup,
                            const CpuUse& cpu) {
  warmup = std::min(warmup, t.size() / 10);
  std::vector<double> half;
  half.reserve(t.size());
  for (std::size_t i = warmup; i + 1 < t.size(); ++i) {
    half.push_back(std::chrono::duration<double, std::micro>(t[i + 1] - t[i]).count() / 2);
  }
  LatResult r;
  if (half.empty()) return LatFailed("no round trips");
  std::sort(half.begin(), half.end());
  r.ok = true;
  r.median_us = Percentile(half, 0.5);
  r.p99_us = Percentile(half, 0.99);
  r.samples = half.size();
  const double rtts = static_cast<double>(t.size() - 1);
  r.cpu_us_per_rtt = cpu.own_cpu_s * 1e6 / rtts;
  r.foreign_cores = cpu.foreign_cores;
  return r;
}

// ---------------------------------------------------------------------------
// 1. TCP stream

BwResult RunTcpStream(const Options& o, std::size_t write_size) {
  const std::array<int, 2> fds = ConnectLoopback();
  if (fds[0] < 0) return Failed("connect failed");
  SetTimeouts(fds[0]);
  SetTimeouts(fds[1]);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> received{0};
  std::atomic<bool> io_error{false};

  std::thread sender([&] {
    PageBuffer buf(write_size);
    FillPattern(buf, 1, 0);
    while (!stop.load(std::memory_order_relaxed)) {
      if (!SendAll(fds[0], buf.data(), buf.size())) {
        io_error.store(true);
        break;
      }
    }
    shutdown(fds[0], SHUT_WR);
  });
  std::thread receiver([&] {
    PageBuffer buf(write_size);
    for (;;) {
      const ssize_t n = recv(fds[1], buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n < 0) io_error.store(true);
        break;
      }
      received.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    }
  });

  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup));
  const std::uint64_t bytes0 = received.load(std::memory_order_relaxed);
  const CpuSnapshot c0 = TakeCpuSnapshot();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  const std::uint64_t bytes1 = received.load(std::memory_order_relaxed);
  const CpuSnapshot c1 = TakeCpuSnapshot();
  stop.store(true);
  sender.join();
  receiver.join();
  close(fds[0]);
  close(fds[1]);
  if (io_error.load()) return Failed("socket error");

  const CpuUse cpu = CpuBetween(c0, c1);
  const double bytes = static_cast<double>(bytes1 - bytes0);
  BwResult r;
  if (bytes <= 0) return Failed("no data moved");
  r.ok = true;
  r.gbps = bytes * 8 / cpu.wall_s / 1e9;
  r.cpu_s_per_gb = cpu.own_cpu_s / (bytes / 1e9);
  r.cpu_us_per_msg = cpu.own_cpu_s * 1e6 / (bytes / static_cast<double>(write_size));
  r.cores = cpu.own_cpu_s / cpu.wall_s;
  r.foreign_cores = cpu.foreign_cores;
  r.switches_per_msg = cpu.context_switches / (bytes / static_cast<double>(write_size));
  return r;
}

// ---------------------------------------------------------------------------
// siwx: two engines, one QP each, over one loopback TCP connection

// Wakes an application thread sleeping until an armed CQ fires (what a
// completion channel and ibv_get_cq_event do for a verbs program).
class CqWaiter {
 public:
  void Notify() {
    {
      std::lock_guard lock(mutex_);
      ++events_;
    }
    cv_.notify_one();
  }
  std::uint64_t events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  // Returns when events() has moved past `seen`, or after `timeout`.
  void WaitPast(std::uint64_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return events_ != seen; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t events_ = 0;  // guarded by mutex_
};

// One end: its own Engine (as a separate process would have), PD, CQs, QP.
struct Side {
  std::unique_ptr<engine::Engine> engine;
  engine::PdId pd = engine::kNoPd;
  std::unique_ptr<engine::CompletionQueue> send_cq;
  std::unique_ptr<engine::CompletionQueue> recv_cq;
  std::shared_ptr<engine::Qp> qp;
  std::atomic<int> async_events{0};
  std::atomic<std::uint32_t> last_event{0};
  std::vector<std::uint32_t> stags;
  CqWaiter send_waiter;  // notified when the armed send CQ fires

  // Registers [buf, buf + size) at TO = its address.
  std::optional<std::uint32_t> Register(PageBuffer& buf, AccessFlags access) {
    const engine::RegisterResult r =
        engine->memory().Register(pd, buf.addr(), buf.size(), buf.addr(), access);
    if (r.status != engine::RegisterStatus::kOk) return std::nullopt;
    stags.push_back(r.stag);
    return r.stag;
  }

  std::string Describe() const {
    if (!qp) return "no QP";
    const engine::QpAttributes a = qp->Query();
    std::ostringstream s;
    s << "qp " << a.qp_num << " state " << static_cast<int>(a.state)
      << " async_events " << async_events.load() << " (last type " << last_event.load() << ")";
    if (a.terminate_sent) s << " terminate_sent";
    if (a.terminate_received) s << " terminate_received";
    if (a.local_error) {
      s << " local_error " << int{a.local_error->layer} << "/" << int{a.local_error->etype} << "/"
        << int{a.local_error->ecode};
    }
    return s.str();
  }
};

class SiwxPair {
 public:
  // Both ends with the same parameters; false (with `error`) on failure.
  bool Create(const engine::StreamParams& params, std::uint32_t sq_depth,
              std::uint32_t max_inline, std::string* error) {
    for (Side* s : {&a_, &b_}) {
      engine::EngineConfig config;
      config.on_async_event = [s](const engine::AsyncEvent& e) {
        s->last_event.store(static_cast<std::uint32_t>(e.type));
        s->async_events.fetch_add(1);
      };
      s->engine = engine::Engine::Create(std::move(config));
      if (!s->engine) return Fail(error, "Engine::Create failed");
      s->pd = s->engine->memory().AllocatePd();
      engine::CompletionQueue::Callbacks send_callbacks;
      send_callbacks.on_completion = [s] { s->send_waiter.Notify(); };
      s->send_cq = engine::CompletionQueue::Create(sq_depth + 16, send_callbacks);
      s->recv_cq = engine::CompletionQueue::Create(64, {});
      if (!s->send_cq || !s->recv_cq) return Fail(error, "CQ create failed");
      engine::QpConfig qc;
      qc.pd = s->pd;
      qc.send_cq = s->send_cq.get();
      qc.recv_cq = s->recv_cq.get();
      qc.sq_caps = {sq_depth, 1, max_inline};
      qc.rq_caps = {16, 1, 0};
      s->qp = s->engine->CreateQp(qc);
      if (!s->qp) return Fail(error, "CreateQp failed");
      if (s->qp->Modify(engine::QpState::kInit) != engine::QpStatus::kOk) {
        return Fail(error, "Modify(INIT) failed");
      }
    }
    const std::array<int, 2> fds = ConnectLoopback();
    if (fds[0] < 0) return Fail(error, "connect failed");
    if (a_.qp->Bind(std::make_unique<transport::TcpStream>(fds[0]), params) !=
        engine::BindStatus::kOk) {
      close(fds[1]);
      return Fail(error, "Bind a failed");
    }
    if (b_.qp->Bind(std::make_unique<transport::TcpStream>(fds[1]), params) !=
        engine::BindStatus::kOk) {
      return Fail(error, "Bind b failed");
    }
    return true;
  }

  ~SiwxPair() {
    // QPs first (no engine thread touches buffers or CQs afterwards), then
    // the engines; CQs and buffers outlive both.
    for (Side* s : {&a_, &b_}) {
      if (s->qp) s->qp->Destroy();
    }
    for (Side* s : {&a_, &b_}) {
      if (s->engine) {
        for (std::uint32_t stag : s->stags) s->engine->memory().Deregister(stag);
      }
      s->qp.reset();
      s->engine.reset();
    }
  }

  Side& a() { return a_; }
  Side& b() { return b_; }

  std::string Describe() const { return "a: " + a_.Describe() + "; b: " + b_.Describe(); }

 private:
  static bool Fail(std::string* error, const char* what) {
    *error = what;
    return false;
  }

  Side a_;
  Side b_;
};

// Waits for `n` completions on `cq`; false on timeout or a failed one.
bool AwaitCompletions(engine::CompletionQueue& cq, std::size_t n, std::string* error) {
  const auto deadline = Clock::now() + kStallTimeout;
  std::array<WorkCompletion, 16> wcs;
  while (n > 0) {
    const std::size_t got = cq.Poll(std::span<WorkCompletion>(wcs.data(), std::min(n, wcs.size())));
    for (std::size_t i = 0; i < got; ++i) {
      if (wcs[i].status != WcStatus::kSuccess) {
        *error = "completion " + std::to_string(wcs[i].wr_id) + " failed: " +
                 std::string(engine::WcStatusName(wcs[i].status));
        return false;
      }
    }
    n -= got;
    if (got == 0 && Clock::now() > deadline) {
      *error = "timed out waiting for a completion";
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// 2. siwx RDMA Write stream

enum class MulpduChoice : std::uint8_t { kFromEmss, kLarge, kEthernet };

struct BwConfig {
  const char* label;
  bool crc;
  MulpduChoice mulpdu;
};

BwResult RunSiwxStream(const Options& o, const BwConfig& bc, std::uint32_t seed) {
  engine::StreamParams params;
  params.crc_enabled = bc.crc;
  params.large_fpdus = bc.mulpdu == MulpduChoice::kLarge;
  if (bc.mulpdu == MulpduChoice::kEthernet) params.max_ulpdu = mpa::Mulpdu(kEthernetEmss, false);

  PageBuffer src(o.msg_size);
  PageBuffer dst(o.msg_size);
  FillPattern(src, seed, 0);
  SiwxPair pair;
  std::string error;
  // Two extra slots: the fence Write and the final Write + Send.
  if (!pair.Create(params, o.window + 4, 0, &error)) return Failed(error);
  Side& a = pair.a();
  Side& b = pair.b();
  const auto src_key = a.Register(src, AccessFlags::kLocalWrite);
  const auto dst_key = b.Register(dst, AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
  if (!src_key || !dst_key) return Failed("Register failed");

  SendWorkRequest wr;
  wr.opcode = SendOpcode::kRdmaWrite;
  wr.num_sge = 1;
  wr.sge[0] = engine::Sge{src.addr(), static_cast<std::uint32_t>(o.msg_size), *src_key};
  wr.remote_addr = dst.addr();
  wr.rkey = *dst_key;

  std::uint64_t posted = 0;     // WRs posted
  std::uint64_t completed = 0;  // WRs known complete (a signaled one retires all before it)
  std::array<WorkCompletion, 32> wcs;
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o.warmup));
  const auto measure_to = measure_from + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o.seconds));
  std::optional<CpuSnapshot> c0;
  CpuSnapshot c1;
  double app0 = 0, app1 = 0;
  std::uint64_t completed0 = 0, completed1 = 0;
  engine::QpCounters tx0{}, rx0{}, tx1{}, rx1{};
  auto last_progress = start;
  for (;;) {
    while (posted - completed < o.window) {
      wr.wr_id = posted;
      wr.flags = (posted + 1) % o.signal_every == 0 ? std::uint32_t{engine::kSendSignaled} : 0u;
      const PostStatus st = a.qp->PostSend(wr);
      if (st != PostStatus::kOk) {
        return Failed("PostSend returned " + std::to_string(static_cast<int>(st)) + "; " +
                      pair.Describe());
      }
      ++posted;
    }
    const std::size_t got = a.send_cq->Poll(std::span<WorkCompletion>(wcs));
    for (std::size_t i = 0; i < got; ++i) {
      if (wcs[i].status != WcStatus::kSuccess) {
        return Failed("Write " + std::to_string(wcs[i].wr_id) + " completed with " +
                      std::string(engine::WcStatusName(wcs[i].status)) + "; " + pair.Describe());
      }
      completed = wcs[i].wr_id + 1;
    }
    const auto now = Clock::now();
    if (got > 0) {
      last_progress = now;
    } else {
      if (o.progress_in_poll) a.qp->ProgressSend();
      if (o.use_event) {
        // Arm, then look again: entries queued before the arm do not fire.
        const std::uint64_t seen = a.send_waiter.events();
        a.send_cq->Arm(engine::CqArm::kNextCompletion);
        if (a.send_cq->size() == 0) a.send_waiter.WaitPast(seen, std::chrono::milliseconds(100));
      }
      if (now - last_progress > kStallTimeout) return Failed("stalled; " + pair.Describe());
    }
    if (!c0 && now >= measure_from) {
      c0 = TakeCpuSnapshot();
      app0 = ThreadCpuSeconds();
      completed0 = completed;
      tx0 = a.qp->Counters();
      rx0 = b.qp->Counters();
    }
    if (now >= measure_to) {
      c1 = TakeCpuSnapshot();
      app1 = ThreadCpuSeconds();
      completed1 = completed;
      tx1 = a.qp->Counters();
      rx1 = b.qp->Counters();
      break;
    }
  }

  // Fence: a signaled Write behind everything, so no WR reads `src` any more.
  wr.wr_id = posted++;
  wr.flags = engine::kSendSignaled;
  if (a.qp->PostSend(wr) != PostStatus::kOk) return Failed("fence PostSend failed");
  {
    const auto deadline = Clock::now() + kStallTimeout;
    while (completed < posted) {
      const std::size_t got = a.send_cq->Poll(std::span<WorkCompletion>(wcs));
      for (std::size_t i = 0; i < got; ++i) {
        if (wcs[i].status != WcStatus::kSuccess) return Failed("drain: a Write failed");
        completed = wcs[i].wr_id + 1;
      }
      if (got == 0 && Clock::now() > deadline) return Failed("drain stalled; " + pair.Describe());
    }
  }
  // The last pattern, then a Send behind it: once it is received, the Write
  // before it is placed (RFC 5040 5.5).
  FillPattern(src, seed, 0xFF);
  engine::ReceiveWorkRequest rwr;
  rwr.wr_id = 1;
  if (b.qp->PostRecv(rwr) != PostStatus::kOk) return Failed("PostRecv failed");
  wr.wr_id = posted++;
  if (a.qp->PostSend(wr) != PostStatus::kOk) return Failed("final Write post failed");
  SendWorkRequest send;
  send.wr_id = posted++;
  send.opcode = SendOpcode::kSend;
  send.flags = engine::kSendSignaled;
  if (a.qp->PostSend(send) != PostStatus::kOk) return Failed("final Send post failed");
  if (!AwaitCompletions(*a.send_cq, 2, &error)) return Failed("final: " + error);
  if (!AwaitCompletions(*b.recv_cq, 1, &error)) return Failed("final receive: " + error);
  if (const auto bad = FirstMismatch(dst, seed, 0xFF)) {
    return Failed("DATA MISMATCH at octet " + std::to_string(*bad) + " of the target");
  }
  if (a.async_events.load() != 0 || b.async_events.load() != 0) {
    return Failed("async event; " + pair.Describe());
  }

  BwResult r;
  if (!c0) return Failed("measurement window never opened");
  const CpuUse cpu = CpuBetween(*c0, c1);
  const double msgs = static_cast<double>(completed1 - completed0);
  const double bytes = msgs * static_cast<double>(o.msg_size);
  if (msgs <= 0) return Failed("no Write completed in the window");
  r.ok = true;
  r.gbps = bytes * 8 / cpu.wall_s / 1e9;
  r.cpu_s_per_gb = cpu.own_cpu_s / (bytes / 1e9);
  r.cpu_us_per_msg = cpu.own_cpu_s * 1e6 / msgs;
  r.cores = cpu.own_cpu_s / cpu.wall_s;
  r.app_cores = (app1 - app0) / cpu.wall_s;
  r.switches_per_msg = cpu.context_switches / msgs;
  r.foreign_cores = cpu.foreign_cores;
  r.max_ulpdu = a.qp->Query().max_ulpdu;
  const auto d = [](std::uint64_t x, std::uint64_t y) { return static_cast<double>(y - x); };
  const double tx_fpdus = d(tx0.tx_fpdus, tx1.tx_fpdus);
  const double rx_fpdus = d(rx0.rx_fpdus, rx1.rx_fpdus);
  const double staged = d(rx0.rx_staged_payload, rx1.rx_staged_payload);
  const double direct = d(rx0.rx_direct_payload, rx1.rx_direct_payload);
  r.fpdus_per_msg = tx_fpdus / msgs;
  r.fpdus_per_sendmsg = tx_fpdus / std::max(1.0, d(tx0.tx_syscalls, tx1.tx_syscalls));
  r.tx_would_block_per_msg = d(tx0.tx_would_block, tx1.tx_would_block) / msgs;
  r.rx_syscalls_per_fpdu = d(rx0.rx_syscalls, rx1.rx_syscalls) / std::max(1.0, rx_fpdus);
  r.rx_staged_fraction = staged / std::max(1.0, staged + direct);
  return r;
}

// ---------------------------------------------------------------------------
// 3. TCP ping-pong variants

std::size_t Warmup(const Options& o) { return std::min<std::size_t>(1000, o.lat_iters / 10); }

// The client's clock of a latency run: it stops after `total` round trips or
// at the time limit, whichever comes first, then tells the server (which
// ends quietly from then on instead of reporting a failure).
class LatencyRun {
 public:
  explicit LatencyRun(const Options& o)
      : total_(o.lat_iters + Warmup(o)),
        limit_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(o.lat_seconds))),
        t_(total_ + 1) {}

  std::size_t total() const { return total_; }
  // Stamps the start of round trip i; false when the time is up.
  bool Begin(std::size_t i) {
    t_[i] = Clock::now();
    return t_[i] <= limit_;
  }
  void Done(std::size_t i) { done_ = i + 1; }
  void Finish() {
    if (done_ == total_) t_[total_] = Clock::now();
    finished_.store(true, std::memory_order_release);
  }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Timestamps of the completed round trips (done + 1 of them).
  std::vector<Clock::time_point> Timestamps() const {
    return {t_.begin(), t_.begin() + static_cast<std::ptrdiff_t>(done_ + 1)};
  }

 private:
  const std::size_t total_;
  const Clock::time_point limit_;
  std::vector<Clock::time_point> t_;
  std::size_t done_ = 0;
  std::atomic<bool> finished_{false};
};

// Blocking (kBlocking) or busy-polling recv (kBusy) on both ends.
enum class TcpPingMode : std::uint8_t { kBlocking, kBusy };

LatResult RunTcpPingPong(const Options& o, TcpPingMode mode) {
  const std::array<int, 2> fds = ConnectLoopback();
  if (fds[0] < 0) return LatFailed("connect failed");
  SetTimeouts(fds[0]);
  SetTimeouts(fds[1]);
  const int flags = mode == TcpPingMode::kBusy ? MSG_DONTWAIT : 0;
  std::atomic<bool> failed{false};

  const CpuSnapshot c0 = TakeCpuSnapshot();
  LatencyRun run(o);
  std::thread server([&] {
    std::array<std::uint8_t, kLatencySize> buf{};
    for (std::size_t i = 0; i < run.total(); ++i) {
      if (!RecvAll(fds[1], buf.data(), buf.size(), flags) ||
          !SendAll(fds[1], buf.data(), buf.size())) {
        if (!run.finished()) failed.store(true);
        return;
      }
    }
  });
  std::array<std::uint8_t, kLatencySize> buf{};
  for (std::size_t i = 0; i < run.total() && run.Begin(i); ++i) {
    buf[kLatencySize - 1] = static_cast<std::uint8_t>(i);
    if (!SendAll(fds[0], buf.data(), buf.size()) ||
        !RecvAll(fds[0], buf.data(), buf.size(), flags)) {
      failed.store(true);
      break;
    }
    run.Done(i);
  }
  run.Finish();
  shutdown(fds[0], SHUT_RDWR);
  server.join();
  const CpuSnapshot c1 = TakeCpuSnapshot();
  close(fds[0]);
  close(fds[1]);
  if (failed.load()) return LatFailed("socket error or stall");
  return LatFromTimestamps(run.Timestamps(), Warmup(o), CpuBetween(c0, c1));
}

// performance-notes.md 3 "same threading": on each end the application thread
// sends directly and spins on memory; an agent thread blocked in recv()
// stores what arrives into that memory (the engine's role).
LatResult RunTcpSameThreading(const Options& o) {
  const std::array<int, 2> fds = ConnectLoopback();
  if (fds[0] < 0) return LatFailed("connect failed");
  SetTimeouts(fds[0]);
  SetTimeouts(fds[1]);
  struct alignas(64) Cell {
    std::atomic<std::uint8_t> value{0};
  };
  std::array<Cell, 2> mem;
  std::atomic<bool> abort{false};

  const CpuSnapshot c0 = TakeCpuSnapshot();
  LatencyRun run(o);
  auto agent = [&](int side) {
    std::array<std::uint8_t, kLatencySize> buf{};
    while (RecvAll(fds[side], buf.data(), buf.size())) {
      mem[side].value.store(buf[kLatencySize - 1], std::memory_order_release);
    }
  };
  // Spins until mem[side] holds `want`; false on abort, stall or the end.
  auto spin = [&](int side, std::uint8_t want) {
    const auto stall_at = Clock::now() + kStallTimeout;
    std::uint32_t spins = 0;
    while (mem[side].value.load(std::memory_order_acquire) != want) {
      if ((++spins & 0xFFF) != 0) continue;
      if (run.finished()) return false;
      if (abort.load(std::memory_order_relaxed) || Clock::now() > stall_at) {
        abort.store(true);
        return false;
      }
    }
    return true;
  };

  std::thread agent_a(agent, 0);
  std::thread agent_b(agent, 1);
  std::thread server([&] {
    std::array<std::uint8_t, kLatencySize> buf{};
    for (std::size_t i = 0; i < run.total(); ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      if (!spin(1, v)) return;
      buf[kLatencySize - 1] = v;
      if (!SendAll(fds[1], buf.data(), buf.size())) {
        abort.store(true);
        return;
      }
    }
  });
  std::array<std::uint8_t, kLatencySize> buf{};
  for (std::size_t i = 0; i < run.total() && run.Begin(i); ++i) {
    const auto v = static_cast<std::uint8_t>(i + 1);
    buf[kLatencySize - 1] = v;
    if (!SendAll(fds[0], buf.data(), buf.size())) {
      abort.store(true);
      break;
    }
    if (!spin(0, v)) break;
    run.Done(i);
  }
  run.Finish();
  server.join();
  shutdown(fds[0], SHUT_RDWR);
  shutdown(fds[1], SHUT_RDWR);
  agent_a.join();
  agent_b.join();
  const CpuSnapshot c1 = TakeCpuSnapshot();
  close(fds[0]);
  close(fds[1]);
  if (abort.load()) return LatFailed("socket error or stall");
  return LatFromTimestamps(run.Timestamps(), Warmup(o), CpuBetween(c0, c1));
}

// ---------------------------------------------------------------------------
// 4. siwx 8 B RDMA Write ping-pong (ib_write_lat)

LatResult RunSiwxPingPong(const Options& o, bool crc) {
  engine::StreamParams params;
  params.crc_enabled = crc;
  SiwxPair pair;
  std::string error;
  if (!pair.Create(params, 16, kLatencySize, &error)) return LatFailed(error);
  PageBuffer buf_a(kLatencySize);
  PageBuffer buf_b(kLatencySize);
  const AccessFlags access = AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite;
  const auto key_a = pair.a().Register(buf_a, access);
  const auto key_b = pair.b().Register(buf_b, access);
  if (!key_a || !key_b) return LatFailed("Register failed");

  std::atomic<bool> abort{false};
  std::string errors[2];  // one per thread

  // Posts the inline Write of `v` into the peer's buffer and waits for its
  // send completion, as ib_write_lat does after every post.
  auto post = [&](int side, Side& s, std::uint64_t peer_addr, std::uint32_t rkey, std::uint8_t v) {
    SendWorkRequest wr;
    wr.wr_id = v;
    wr.opcode = SendOpcode::kRdmaWrite;
    wr.flags = engine::kSendSignaled | engine::kSendInline;
    wr.inline_length = kLatencySize;
    wr.inline_data[kLatencySize - 1] = v;
    wr.remote_addr = peer_addr;
    wr.rkey = rkey;
    const PostStatus st = s.qp->PostSend(wr);
    if (st != PostStatus::kOk) {
      errors[side] = "PostSend returned " + std::to_string(static_cast<int>(st));
      abort.store(true);
      return false;
    }
    std::array<WorkCompletion, 1> wc;
    const auto stall_at = Clock::now() + kStallTimeout;
    std::uint32_t spins = 0;
    while (s.send_cq->Poll(std::span<WorkCompletion>(wc)) == 0) {
      if ((++spins & 0xFFF) == 0 &&
          (abort.load(std::memory_order_relaxed) || Clock::now() > stall_at)) {
        errors[side] = "no send completion";
        abort.store(true);
        return false;
      }
    }
    if (wc[0].status != WcStatus::kSuccess) {
      errors[side] = "Write completed with " + std::string(engine::WcStatusName(wc[0].status));
      abort.store(true);
      return false;
    }
    return true;
  };

  const CpuSnapshot c0 = TakeCpuSnapshot();
  LatencyRun run(o);
  // Spins on the last octet of `own` until the peer's Write put `want` there.
  auto spin = [&](int side, PageBuffer& own, std::uint8_t want) {
    std::uint8_t& last = own.data()[kLatencySize - 1];
    const auto stall_at = Clock::now() + kStallTimeout;
    std::uint32_t spins = 0;
    while (SpinLoad(last) != want) {
      if ((++spins & 0xFFF) != 0) continue;
      if (run.finished()) return false;
      if (abort.load(std::memory_order_relaxed) || Clock::now() > stall_at) {
        if (errors[side].empty()) errors[side] = "the peer's Write never arrived";
        abort.store(true);
        return false;
      }
    }
    return true;
  };

  std::thread server([&] {
    for (std::size_t i = 0; i < run.total(); ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      if (!spin(1, buf_b, v) || !post(1, pair.b(), buf_a.addr(), *key_a, v)) return;
    }
  });
  for (std::size_t i = 0; i < run.total() && run.Begin(i); ++i) {
    const auto v = static_cast<std::uint8_t>(i + 1);
    if (!post(0, pair.a(), buf_b.addr(), *key_b, v) || !spin(0, buf_a, v)) break;
    run.Done(i);
  }
  run.Finish();
  server.join();
  const CpuSnapshot c1 = TakeCpuSnapshot();
  if (abort.load()) {
    return LatFailed("client: " + errors[0] + "; server: " + errors[1] + "; " + pair.Describe());
  }
  if (pair.a().async_events.load() != 0 || pair.b().async_events.load() != 0) {
    return LatFailed("async event; " + pair.Describe());
  }
  return LatFromTimestamps(run.Timestamps(), Warmup(o), CpuBetween(c0, c1));
}

// ---------------------------------------------------------------------------
// Table

struct Row {
  std::string name;
  std::string unit;
  int precision = 2;
  std::vector<double> values;
  std::vector<double> ratios;  // per round, against the row's TCP reference
  std::string ratio_note;      // what the ratio is against
  std::string goal;
  std::vector<double> foreign;
  std::vector<std::string> failures;
};

void PrintRow(const Row& r) {
  const Summary v = Summarize(r.values);
  const Summary q = Summarize(r.ratios);
  const Summary f = Summarize(r.foreign);
  const std::string name = r.name + (r.unit.empty() ? "" : " [" + r.unit + "]");
  std::printf("%-58s", name.c_str());
  if (v.valid) {
    std::printf(" %9.*f %9.*f %9.*f", r.precision, v.median, r.precision, v.min, r.precision,
                v.max);
  } else {
    std::printf(" %9s %9s %9s", "-", "-", "-");
  }
  if (q.valid) {
    std::printf("  %6.3f %-9s", q.median, r.ratio_note.c_str());
  } else {
    std::printf("  %6s %-9s", "-", "");
  }
  std::printf(" %-18s", r.goal.c_str());
  if (f.valid) {
    std::printf(" %5.2f", f.median);
  } else {
    std::printf(" %5s", "");
  }
  if (!r.failures.empty()) {
    std::printf("  FAIL x%zu", r.failures.size());
  }
  std::printf("\n");
}

// ---------------------------------------------------------------------------
// Options

bool ParseDouble(std::string_view text, double* out) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !(v > 0)) return false;
  *out = v;
  return true;
}

bool ParseUint(std::string_view text, std::uint32_t* out) {
  double v = 0;
  if (!ParseDouble(text, &v) || v != std::floor(v) || v > 1e9) return false;
  *out = static_cast<std::uint32_t>(v);
  return true;
}

void Usage() {
  std::printf(
      "usage: engine_bench [options]\n"
      "  --reps=N           repetitions of every row (default 5)\n"
      "  --seconds=S        measured seconds per stream run (default 2)\n"
      "  --quick            --reps=3 --seconds=0.5 --lat-iters=5000 --lat-seconds=1\n"
      "  --lat-iters=N      round trips per latency run (default 20000)\n"
      "  --lat-seconds=S    ... or fewer if a run takes longer than S (default 3)\n"
      "  --window=N         outstanding Writes in the stream runs (default 128)\n"
      "  --signal-every=N   signal every Nth Write (default 16, <= window)\n"
      "  --size=N           stream message size in octets (default 65536)\n"
      "  --only=bw|lat      run one half only\n"
      "  --no-ethernet      skip the EMSS-1448 MULPDU row\n"
      "  --filter=TEXT      siwx stream rows whose label contains TEXT only\n"
      "  --use-event        the stream application thread arms the CQ and sleeps\n"
      "                     until it fires (ib_write_bw --use_event) instead of\n"
      "                     busy-polling\n"
      "  --progress-in-poll the stream poll loop calls Qp::ProgressSend when\n"
      "                     the CQ is empty (an experiment; the provider's\n"
      "                     poll_cq does not)\n");
}

// Returns false (after printing why) on a bad command line.
bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    std::string_view value;
    const std::size_t eq = arg.find('=');
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc && (arg == "--reps" || arg == "--seconds" || arg == "--lat-iters" || arg == "--lat-seconds" ||
                                arg == "--window" || arg == "--signal-every" ||
                                arg == "--size" || arg == "--only" || arg == "--filter")) {
      value = argv[++i];
    }
    std::uint32_t u = 0;
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      Usage();
      std::exit(0);
    } else if (arg == "--quick") {
      o->reps = 3;
      o->seconds = 0.5;
      o->warmup = 0.1;
      o->lat_iters = 5000;
      o->lat_seconds = 1.0;
    } else if (arg == "--reps") {
      ok = ParseUint(value, &u) && u <= 1000;
      o->reps = static_cast<int>(u);
    } else if (arg == "--seconds") {
      ok = ParseDouble(value, &o->seconds) && o->seconds <= 3600;
    } else if (arg == "--lat-seconds") {
      ok = ParseDouble(value, &o->lat_seconds) && o->lat_seconds <= 3600;
    } else if (arg == "--lat-iters") {
      ok = ParseUint(value, &o->lat_iters);
    } else if (arg == "--window") {
      ok = ParseUint(value, &o->window) && o->window <= (1u << 16);
    } else if (arg == "--signal-every") {
      ok = ParseUint(value, &o->signal_every);
    } else if (arg == "--size") {
      ok = ParseUint(value, &u) && u <= (1u << 30);
      o->msg_size = u;
    } else if (arg == "--only") {
      ok = value == "bw" || value == "lat";
      o->run_bw = value == "bw";
      o->run_lat = value == "lat";
    } else if (arg == "--filter") {
      o->filter = std::string(value);
    } else if (arg == "--no-ethernet") {
      o->ethernet_rows = false;
    } else if (arg == "--use-event") {
      o->use_event = true;
    } else if (arg == "--progress-in-poll") {
      o->progress_in_poll = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "engine_bench: bad argument '%s'\n", argv[i]);
      Usage();
      return false;
    }
  }
  if (o->signal_every > o->window) {
    std::fprintf(stderr, "engine_bench: --signal-every must not exceed --window\n");
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;

  utsname un{};
  uname(&un);
  std::printf("engine_bench: %s %s, %ld CPUs online\n", un.sysname, un.release,
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("options: reps %d, seconds %.2f (+%.2f warm-up), size %zu, window %u, "
              "signal every %u, lat iters %u (<= %.1f s)%s%s\n",
              o.reps, o.seconds, o.warmup, o.msg_size, o.window, o.signal_every, o.lat_iters,
              o.lat_seconds, o.use_event ? ", CQ events" : ", CQ busy-poll",
              o.progress_in_poll ? ", progress in poll" : "");
  std::printf("loadavg at start: %s\n", LoadAverage().c_str());
  std::fflush(stdout);

  std::vector<BwConfig> bw_configs = {
      {"siwx Write, MULPDU from EMSS, CRC off", false, MulpduChoice::kFromEmss},
      {"siwx Write, MULPDU from EMSS, CRC on", true, MulpduChoice::kFromEmss},
      {"siwx Write, large FPDUs, CRC off", false, MulpduChoice::kLarge},
      {"siwx Write, large FPDUs, CRC on", true, MulpduChoice::kLarge},
  };
  if (o.ethernet_rows) {
    // CRC on: hardware peers normally negotiate it.
    bw_configs.push_back({"siwx Write, MULPDU for EMSS 1448, CRC on", true,
                          MulpduChoice::kEthernet});
  }
  if (!o.filter.empty()) {
    std::erase_if(bw_configs, [&](const BwConfig& c) {
      return std::string_view(c.label).find(o.filter) == std::string_view::npos;
    });
  }

  // Bandwidth rows: Gb/s, CPU per GB and (except for 1b) CPU per message.
  // bw[0] is (1), bw[1] is (1b), bw[2 + i] is bw_configs[i].
  struct BwRows {
    std::string label;  // for the diagnostics table
    bool per_msg_row = true;
    Row gbps, per_gb, per_msg;
    std::vector<double> cores, app_cores, switches, max_ulpdu, fpdus_per_msg, fpdus_per_sendmsg,
        would_block, rx_calls, staged;
  };
  constexpr std::size_t kFirstSiwxRow = 2;
  std::vector<BwRows> bw(kFirstSiwxRow + bw_configs.size());
  auto init_bw = [](BwRows& r, const std::string& name, std::size_t size, const std::string& goal,
                    const std::string& ratio_note) {
    r.label = name;
    r.gbps.name = name + ", " + std::to_string(size / 1024) + " KiB";
    r.gbps.unit = "Gb/s";
    r.gbps.goal = goal;
    r.per_gb.name = "  CPU per GB moved (both ends)";
    r.per_gb.unit = "core-s/GB";
    r.per_gb.precision = 3;
    r.per_msg.name = "  CPU per message (both ends)";
    r.per_msg.unit = "us";
    for (Row* row : {&r.gbps, &r.per_gb, &r.per_msg}) row->ratio_note = ratio_note;
  };
  init_bw(bw[0], "(1) TCP stream, blocking writes", o.msg_size, "reference", "");
  init_bw(bw[1], "(1b) TCP stream, blocking writes", kLargeWriteSize, "info", "x (1)");
  bw[1].per_msg_row = false;
  for (std::size_t i = 0; i < bw_configs.size(); ++i) {
    std::string goal = "info";
    if (bw_configs[i].mulpdu != MulpduChoice::kEthernet) {
      goal = bw_configs[i].crc ? ">= 0.90" : ">= 0.95";
    }
    init_bw(bw[kFirstSiwxRow + i], std::string("(2) ") + bw_configs[i].label, o.msg_size, goal,
            "x (1)");
  }

  // Latency rows.
  enum LatIndex { kTcpBlocking, kTcpSameThreading, kTcpBusy, kSiwxOff, kSiwxOn, kLatRows };
  std::array<Row, kLatRows> lat;
  std::array<Row, kLatRows> lat_p99;
  std::array<Row, kLatRows> lat_cpu;
  const char* lat_names[kLatRows] = {
      "(3) TCP ping-pong 8 B, blocking, 2 threads",
      "(3b) TCP 8 B, same threading as (4) (app spins, agent recv)",
      "(3c) TCP ping-pong 8 B, busy-poll recv (floor)",
      "(4) siwx 8 B Write ping-pong, CRC off",
      "(4) siwx 8 B Write ping-pong, CRC on",
  };
  for (int i = 0; i < kLatRows; ++i) {
    lat[i].name = std::string(lat_names[i]) + ", 1/2 RTT";
    lat[i].unit = "us";
    lat_p99[i].name = "  p99 1/2 RTT";
    lat_p99[i].unit = "us";
    lat_cpu[i].name = "  CPU per round trip (both ends)";
    lat_cpu[i].unit = "us";
  }
  lat[kSiwxOff].ratio_note = lat[kSiwxOn].ratio_note = "x (3)";
  lat[kSiwxOff].goal = lat[kSiwxOn].goal = "<= 1.5; <= 17 us";
  // The fair comparison: the same thread structure without the engine.
  std::array<Row, 2> lat_vs_same;
  std::array<Row, 2> lat_vs_busy;
  for (int k = 0; k < 2; ++k) {
    lat_vs_same[k].name = std::string("  ") + (k == 0 ? "CRC off" : "CRC on") +
                          ": siwx / same-threading TCP (3b)";
    lat_vs_same[k].ratio_note = "x (3b)";
    lat_vs_same[k].goal = "info (fair cmp)";
    lat_vs_busy[k].name = std::string("  ") + (k == 0 ? "CRC off" : "CRC on") +
                          ": siwx / busy-poll TCP floor (3c)";
    lat_vs_busy[k].ratio_note = "x (3c)";
    lat_vs_busy[k].goal = "<= 5 (anchors 3.2)";
  }

  bool any_failure = false;
  const auto t_start = Clock::now();
  for (int rep = 0; rep < o.reps; ++rep) {
    const auto seed = static_cast<std::uint32_t>(rep * 16 + 1);
    if (o.run_bw) {
      const BwResult tcp = RunTcpStream(o, o.msg_size);
      auto record = [&](BwRows& rows, const BwResult& r, const BwResult* ref) {
        if (!r.ok) {
          rows.gbps.failures.push_back(r.error);
          any_failure = true;
          std::printf("  [round %d] %s: FAIL: %s\n", rep + 1, rows.gbps.name.c_str(),
                      r.error.c_str());
          return;
        }
        rows.gbps.values.push_back(r.gbps);
        rows.per_gb.values.push_back(r.cpu_s_per_gb);
        rows.per_msg.values.push_back(r.cpu_us_per_msg);
        rows.gbps.foreign.push_back(r.foreign_cores);
        if (ref != nullptr && ref->ok) {
          rows.gbps.ratios.push_back(r.gbps / ref->gbps);
          rows.per_gb.ratios.push_back(r.cpu_s_per_gb / ref->cpu_s_per_gb);
          rows.per_msg.ratios.push_back(r.cpu_us_per_msg / ref->cpu_us_per_msg);
        }
        rows.cores.push_back(r.cores);
        rows.app_cores.push_back(r.app_cores);
        rows.switches.push_back(r.switches_per_msg);
        rows.max_ulpdu.push_back(static_cast<double>(r.max_ulpdu));
        rows.fpdus_per_msg.push_back(r.fpdus_per_msg);
        rows.fpdus_per_sendmsg.push_back(r.fpdus_per_sendmsg);
        rows.would_block.push_back(r.tx_would_block_per_msg);
        rows.rx_calls.push_back(r.rx_syscalls_per_fpdu);
        rows.staged.push_back(r.rx_staged_fraction);
        std::printf("  [round %d] %-52s %7.2f Gb/s  %.2f cores  foreign %.2f\n", rep + 1,
                    rows.gbps.name.c_str(), r.gbps, r.cores, r.foreign_cores);
        std::fflush(stdout);
      };
      record(bw[0], tcp, nullptr);
      record(bw[1], RunTcpStream(o, kLargeWriteSize), &tcp);
      for (std::size_t i = 0; i < bw_configs.size(); ++i) {
        record(bw[kFirstSiwxRow + i],
               RunSiwxStream(o, bw_configs[i], seed + static_cast<std::uint32_t>(i)), &tcp);
      }
    }
    if (o.run_lat) {
      std::array<LatResult, kLatRows> res;
      res[kTcpBlocking] = RunTcpPingPong(o, TcpPingMode::kBlocking);
      res[kTcpSameThreading] = RunTcpSameThreading(o);
      res[kTcpBusy] = RunTcpPingPong(o, TcpPingMode::kBusy);
      res[kSiwxOff] = RunSiwxPingPong(o, false);
      res[kSiwxOn] = RunSiwxPingPong(o, true);
      for (int i = 0; i < kLatRows; ++i) {
        const LatResult& r = res[i];
        if (!r.ok) {
          lat[i].failures.push_back(r.error);
          any_failure = true;
          std::printf("  [round %d] %s: FAIL: %s\n", rep + 1, lat[i].name.c_str(),
                      r.error.c_str());
          continue;
        }
        lat[i].values.push_back(r.median_us);
        lat[i].foreign.push_back(r.foreign_cores);
        lat_p99[i].values.push_back(r.p99_us);
        lat_cpu[i].values.push_back(r.cpu_us_per_rtt);
        std::printf("  [round %d] %-60s %7.2f us  p99 %8.2f  n %6zu  foreign %.2f\n",
                    rep + 1, lat_names[i], r.median_us, r.p99_us, r.samples, r.foreign_cores);
      }
      for (int k = 0; k < 2; ++k) {
        const LatResult& s = res[kSiwxOff + k];
        if (!s.ok) continue;
        if (res[kTcpBlocking].ok) {
          lat[kSiwxOff + k].ratios.push_back(s.median_us / res[kTcpBlocking].median_us);
        }
        if (res[kTcpSameThreading].ok) {
          lat_vs_same[k].ratios.push_back(s.median_us / res[kTcpSameThreading].median_us);
        }
        if (res[kTcpBusy].ok) {
          lat_vs_busy[k].ratios.push_back(s.median_us / res[kTcpBusy].median_us);
        }
      }
      std::fflush(stdout);
    }
  }

  std::printf("\nloadavg at end: %s (run took %.0f s)\n", LoadAverage().c_str(),
              Seconds(Clock::now() - t_start));
  std::printf("\nMedian, min, max over %d rounds. \"ratio\" is the median of per-round ratios "
              "against the\nTCP row of the same round; \"foreign\" is the median CPU (cores) "
              "other processes used\n(tick-sampled: rough, and it reads low or negative "
              "for the wake-heavy latency rows).\n\n",
              o.reps);
  std::printf("%-58s %9s %9s %9s  %6s %-9s %-18s %5s\n", "quantity", "median", "min", "max",
              "ratio", "(vs)", "goal", "foreign");
  std::printf("%s\n", std::string(128, '-').c_str());
  if (o.run_bw) {
    for (const BwRows& r : bw) {
      PrintRow(r.gbps);
      PrintRow(r.per_gb);
      if (r.per_msg_row) PrintRow(r.per_msg);
    }
  }
  if (o.run_lat) {
    for (int i = 0; i < kLatRows; ++i) {
      PrintRow(lat[i]);
      PrintRow(lat_p99[i]);
      PrintRow(lat_cpu[i]);
      if (i == kSiwxOff || i == kSiwxOn) {
        PrintRow(lat_vs_same[i - kSiwxOff]);
        PrintRow(lat_vs_busy[i - kSiwxOff]);
      }
    }
  }

  if (o.run_bw) {
    std::printf(
        "\nStream diagnostics (medians over the measured windows):\n"
        "  cores       process CPU, all threads of both ends\n"
        "  app         the application thread alone: it posts, transmits inline and polls the\n"
        "              CQ (busy-polls, ib_write_bw style, unless --use-event)\n"
        "  cs/msg      context switches of the process per message\n"
        "  engine QP counters: FPDUs per message and per sendmsg, sendmsg calls that found\n"
        "  the socket full (EAGAIN), recvmsg calls per FPDU, and the share of payload copied\n"
        "  from the staging buffer instead of placed directly\n");
    std::printf("%-44s %6s %6s %8s %8s %8s %9s %10s %11s %7s\n", "row", "cores", "app",
                "cs/msg", "maxULPDU", "FPDU/msg", "FPDU/call", "EAGAIN/msg", "rxcall/FPDU",
                "staged");
    for (std::size_t i = 0; i < bw.size(); ++i) {
      const BwRows& r = bw[i];
      if (r.cores.empty()) continue;
      if (i < kFirstSiwxRow) {
        std::printf("%-44s %6.2f %6s %8.2f\n", r.label.c_str(), Summarize(r.cores).median, "",
                    Summarize(r.switches).median);
        continue;
      }
      std::printf("%-44s %6.2f %6.2f %8.2f %8.0f %8.2f %9.2f %10.3f %11.2f %6.1f%%\n",
                  r.label.c_str(), Summarize(r.cores).median,
                  Summarize(r.app_cores).median, Summarize(r.switches).median,
                  Summarize(r.max_ulpdu).median,
                  Summarize(r.fpdus_per_msg).median,
                  Summarize(r.fpdus_per_sendmsg).median, Summarize(r.would_block).median,
                  Summarize(r.rx_calls).median, 100 * Summarize(r.staged).median);
    }
  }

  if (any_failure) {
    std::printf("\nFAILURES (a broken run reports no figure):\n");
    auto dump = [](const Row& r) {
      for (const std::string& f : r.failures) std::printf("  %s: %s\n", r.name.c_str(), f.c_str());
    };
    for (const BwRows& r : bw) dump(r.gbps);
    for (const Row& r : lat) dump(r);
    return 1;
  }
  std::printf("\nall siwx runs passed their data checks\n");
  return 0;
}

}  // namespace
}  // namespace siwx::bench

int main(int argc, char** argv) { return siwx::bench::Main(argc, argv); }
