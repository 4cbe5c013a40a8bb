// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// engine_bench: the kernel TCP references on loopback (rows 1 and 3 of the
// table in engine_bench.cc). Each run starts its own threads and joins them.
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "benchmarks/bench_util.h"
#include "benchmarks/engine_bench.h"

namespace siwx::bench {

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

// docs/performance-notes.md 3, "same threading": on each end the application thread
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

}  // namespace siwx::bench
