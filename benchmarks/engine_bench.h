// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What the runs of engine_bench share: the options, the result records and
// the run entry points. engine_bench_tcp.cc holds the kernel TCP references,
// engine_bench_siwx.cc the siwx runs, engine_bench.cc the table and main.
// Each run is called from the main thread and joins every thread it starts
// before it returns.
#ifndef SIWX_BENCHMARKS_ENGINE_BENCH_H_
#define SIWX_BENCHMARKS_ENGINE_BENCH_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/bench_util.h"

namespace siwx::bench {

inline constexpr std::size_t kLatencySize = 8;  // ib_write_lat -s 8
// Ethernet EMSS (1500 MTU, TCP timestamps): the MULPDU a hardware peer wants.
inline constexpr std::size_t kEthernetEmss = 1448;
// The second TCP reference: about what one siwx sendmsg carries when the
// socket has room (a batch of FPDUs), and where loopback TCP peaks.
inline constexpr std::size_t kLargeWriteSize = std::size_t{1} << 20;

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

inline BwResult Failed(std::string why) {
  BwResult r;
  r.error = std::move(why);
  return r;
}

inline LatResult LatFailed(std::string why) {
  LatResult r;
  r.error = std::move(why);
  return r;
}

// Half round trips (us) from the client's timestamps, warm-up dropped (at
// most a tenth of what completed, for runs the time limit cut short).
LatResult LatFromTimestamps(const std::vector<Clock::time_point>& t, std::size_t warmup,
                            const CpuUse& cpu);

// ---------------------------------------------------------------------------
// Latency runs

// Round trips left out at the start of a latency run.
inline std::size_t Warmup(const Options& o) {
  return std::min<std::size_t>(1000, o.lat_iters / 10);
}

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

// ---------------------------------------------------------------------------
// The runs

// 1. TCP stream of `write_size` blocking writes.
BwResult RunTcpStream(const Options& o, std::size_t write_size);

// 2. siwx RDMA Write (or Read) stream.
enum class MulpduChoice : std::uint8_t { kFromEmss, kLarge, kEthernet };

struct BwConfig {
  const char* label;
  bool crc;
  MulpduChoice mulpdu;
  // RDMA Reads of the same size instead of Writes (ib_read_bw): the other
  // end's progress thread answers them, with CRC from a staged copy.
  bool read = false;
};
BwResult RunSiwxStream(const Options& o, const BwConfig& bc, std::uint32_t seed);

// 3. TCP ping-pong, blocking (kBlocking) or busy-polling recv (kBusy) on both
// ends.
enum class TcpPingMode : std::uint8_t { kBlocking, kBusy };
LatResult RunTcpPingPong(const Options& o, TcpPingMode mode);
// 3b. The application spins on memory an agent thread blocked in recv() writes.
LatResult RunTcpSameThreading(const Options& o);

// 4. siwx 8 B RDMA Write ping-pong (ib_write_lat).
LatResult RunSiwxPingPong(const Options& o, bool crc);

}  // namespace siwx::bench

#endif  // SIWX_BENCHMARKS_ENGINE_BENCH_H_
