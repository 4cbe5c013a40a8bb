// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The harness of engine_bench: statistics, CPU snapshots, pattern buffers,
// loopback TCP helpers and option parsing. Nothing here knows the engine; the
// runs (engine_bench_tcp.cc, engine_bench_siwx.cc) and the table
// (engine_bench.cc) build on it. Every function is safe to call from any
// thread; PageBuffer is owned by one run.
#ifndef SIWX_BENCHMARKS_BENCH_UTIL_H_
#define SIWX_BENCHMARKS_BENCH_UTIL_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace siwx::bench {

using Clock = std::chrono::steady_clock;

// A run that makes no progress for this long is declared stalled.
inline constexpr std::chrono::seconds kStallTimeout{10};

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---------------------------------------------------------------------------
// Statistics

struct Summary {
  bool valid = false;
  double median = 0, min = 0, max = 0;
};

Summary Summarize(std::vector<double> v);

// The p-quantile (0 <= p <= 1) of sorted values, nearest rank below; 0 if empty.
double Percentile(const std::vector<double>& sorted, double p);

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
std::uint64_t MachineBusyTicks();
CpuSnapshot TakeCpuSnapshot();

struct CpuUse {
  double wall_s = 0;
  double own_cpu_s = 0;
  double foreign_cores = 0;  // other processes, averaged over the interval
  double context_switches = 0;
};

CpuUse CpuBetween(const CpuSnapshot& a, const CpuSnapshot& b);

// CPU time of the calling thread.
double ThreadCpuSeconds();

// The line of /proc/loadavg.
std::string LoadAverage();

// ---------------------------------------------------------------------------
// Buffers and patterns

// Page-aligned, zero-filled memory (what ib_write_bw registers).
class PageBuffer {
 public:
  explicit PageBuffer(std::size_t size);
  ~PageBuffer();
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  std::uint8_t* data() { return data_; }
  std::size_t size() const { return size_; }
  std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(data_); }

 private:
  std::size_t size_;
  std::uint8_t* data_ = nullptr;
};

std::uint8_t PatternByte(std::uint32_t seed, std::size_t i);
void FillPattern(PageBuffer& b, std::uint32_t seed, std::uint8_t flip);
// Offset of the first octet that differs from the pattern, or nullopt.
std::optional<std::size_t> FirstMismatch(PageBuffer& b, std::uint32_t seed, std::uint8_t flip);

// Reads a byte the peer's engine writes behind our back (ib_write_lat's
// `volatile` poll). The engine's copy is not atomic; a single octet cannot
// tear.
inline std::uint8_t SpinLoad(std::uint8_t& octet) {
  return std::atomic_ref<std::uint8_t>(octet).load(std::memory_order_acquire);
}

// ---------------------------------------------------------------------------
// Sockets

// SO_RCVTIMEO and SO_SNDTIMEO of kStallTimeout.
void SetTimeouts(int fd);

// A connected loopback TCP pair {client, server}: blocking, TCP_NODELAY.
// {-1, -1} on failure.
std::array<int, 2> ConnectLoopback();

bool SendAll(int fd, const std::uint8_t* p, std::size_t n);
// With MSG_DONTWAIT in `flags` it spins; false after kStallTimeout.
bool RecvAll(int fd, std::uint8_t* p, std::size_t n, int flags = 0);

// ---------------------------------------------------------------------------
// Options

// A positive number, the whole of `text`.
bool ParseDouble(std::string_view text, double* out);
// A positive whole number up to 10^9.
bool ParseUint(std::string_view text, std::uint32_t* out);

}  // namespace siwx::bench

#endif  // SIWX_BENCHMARKS_BENCH_UTIL_H_
