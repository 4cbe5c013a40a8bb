// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
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
// integrity. This file holds the table and main; the runs are in
// engine_bench_tcp.cc and engine_bench_siwx.cc (declared in engine_bench.h),
// the harness (statistics, CPU, buffers, sockets) in bench_util.h.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/bench_util.h"
#include "benchmarks/engine_bench.h"

namespace siwx::bench {

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

namespace {

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

void PrintRowFailures(const Row& r) {
  for (const std::string& f : r.failures) std::printf("  %s: %s\n", r.name.c_str(), f.c_str());
}

// ---------------------------------------------------------------------------
// Options

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
      "  --no-ethernet      skip the EMSS-1448 MULPDU rows\n"
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
// Bandwidth rows: Gb/s, CPU per GB and (except for 1b) CPU per message, and
// the stream diagnostics. rows_[0] is (1), rows_[1] is (1b), rows_[2 + i] is
// configs_[i].

class BandwidthTable {
 public:
  explicit BandwidthTable(const Options& o) {
    configs_ = {
        {"siwx Write, MULPDU from EMSS, CRC off", false, MulpduChoice::kFromEmss},
        {"siwx Write, MULPDU from EMSS, CRC on", true, MulpduChoice::kFromEmss},
        {"siwx Write, large FPDUs, CRC off", false, MulpduChoice::kLarge},
        {"siwx Write, large FPDUs, CRC on", true, MulpduChoice::kLarge},
        {"siwx Read, MULPDU from EMSS, CRC off", false, MulpduChoice::kFromEmss, true},
        {"siwx Read, MULPDU from EMSS, CRC on", true, MulpduChoice::kFromEmss, true},
    };
    if (o.ethernet_rows) {
      // Standard framing between two hosts on Ethernet (what every non-siwx
      // peer sends), CRC off and on (hardware peers normally negotiate it).
      configs_.push_back({"siwx Write, MULPDU for EMSS 1448, CRC off", false,
                          MulpduChoice::kEthernet});
      configs_.push_back({"siwx Write, MULPDU for EMSS 1448, CRC on", true,
                          MulpduChoice::kEthernet});
    }
    if (!o.filter.empty()) {
      std::erase_if(configs_, [&](const BwConfig& c) {
        return std::string_view(c.label).find(o.filter) == std::string_view::npos;
      });
    }
    rows_.resize(kFirstSiwxRow + configs_.size());
    Init(rows_[0], "(1) TCP stream, blocking writes", o.msg_size, "reference", "");
    Init(rows_[1], "(1b) TCP stream, blocking writes", kLargeWriteSize, "info", "x (1)");
    rows_[1].per_msg_row = false;
    for (std::size_t i = 0; i < configs_.size(); ++i) {
      std::string goal = "info";
      if (configs_[i].mulpdu != MulpduChoice::kEthernet) {
        goal = configs_[i].crc ? ">= 0.90" : ">= 0.95";
      }
      Init(rows_[kFirstSiwxRow + i], std::string("(2) ") + configs_[i].label, o.msg_size, goal,
           "x (1)");
    }
  }

  // Runs every row once; false if a run failed.
  bool RunRound(const Options& o, int rep) {
    const auto seed = static_cast<std::uint32_t>(rep * 16 + 1);
    const BwResult tcp = RunTcpStream(o, o.msg_size);
    bool ok = Record(rep, rows_[0], tcp, nullptr);
    ok &= Record(rep, rows_[1], RunTcpStream(o, kLargeWriteSize), &tcp);
    for (std::size_t i = 0; i < configs_.size(); ++i) {
      ok &= Record(rep, rows_[kFirstSiwxRow + i],
                   RunSiwxStream(o, configs_[i], seed + static_cast<std::uint32_t>(i)), &tcp);
    }
    return ok;
  }

  void Print() const {
    for (const Rows& r : rows_) {
      PrintRow(r.gbps);
      PrintRow(r.per_gb);
      if (r.per_msg_row) PrintRow(r.per_msg);
    }
  }

  void PrintDiagnostics() const {
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
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const Rows& r = rows_[i];
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

  void PrintFailures() const {
    for (const Rows& r : rows_) PrintRowFailures(r.gbps);
  }

 private:
  static constexpr std::size_t kFirstSiwxRow = 2;

  struct Rows {
    std::string label;  // for the diagnostics table
    bool per_msg_row = true;
    Row gbps, per_gb, per_msg;
    std::vector<double> cores, app_cores, switches, max_ulpdu, fpdus_per_msg, fpdus_per_sendmsg,
        would_block, rx_calls, staged;
  };

  static void Init(Rows& r, const std::string& name, std::size_t size, const std::string& goal,
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
  }

  // Adds one round's result (and its ratios to `ref`); false if it failed.
  static bool Record(int rep, Rows& rows, const BwResult& r, const BwResult* ref) {
    if (!r.ok) {
      rows.gbps.failures.push_back(r.error);
      std::printf("  [round %d] %s: FAIL: %s\n", rep + 1, rows.gbps.name.c_str(),
                  r.error.c_str());
      return false;
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
    return true;
  }

  std::vector<BwConfig> configs_;
  std::vector<Rows> rows_;
};

// ---------------------------------------------------------------------------
// Latency rows: half round trip, p99 and CPU per round trip of (3), (3b),
// (3c) and (4), and the siwx rows' ratios to each TCP variant.

class LatencyTable {
 public:
  LatencyTable() {
    for (int i = 0; i < kLatRows; ++i) {
      lat_[i].name = std::string(kNames[i]) + ", 1/2 RTT";
      lat_[i].unit = "us";
      p99_[i].name = "  p99 1/2 RTT";
      p99_[i].unit = "us";
      cpu_[i].name = "  CPU per round trip (both ends)";
      cpu_[i].unit = "us";
    }
    lat_[kSiwxOff].ratio_note = lat_[kSiwxOn].ratio_note = "x (3)";
    lat_[kSiwxOff].goal = lat_[kSiwxOn].goal = "<= 1.5; <= 17 us";
    // The fair comparison: the same thread structure without the engine.
    for (int k = 0; k < 2; ++k) {
      vs_same_[k].name = std::string("  ") + (k == 0 ? "CRC off" : "CRC on") +
                         ": siwx / same-threading TCP (3b)";
      vs_same_[k].ratio_note = "x (3b)";
      vs_same_[k].goal = "info (fair cmp)";
      vs_busy_[k].name = std::string("  ") + (k == 0 ? "CRC off" : "CRC on") +
                         ": siwx / busy-poll TCP floor (3c)";
      vs_busy_[k].ratio_note = "x (3c)";
      vs_busy_[k].goal = "<= 5 (anchors 3.2)";
    }
  }

  // Runs every row once; false if a run failed.
  bool RunRound(const Options& o, int rep) {
    std::array<LatResult, kLatRows> res;
    res[kTcpBlocking] = RunTcpPingPong(o, TcpPingMode::kBlocking);
    res[kTcpSameThreading] = RunTcpSameThreading(o);
    res[kTcpBusy] = RunTcpPingPong(o, TcpPingMode::kBusy);
    res[kSiwxOff] = RunSiwxPingPong(o, false);
    res[kSiwxOn] = RunSiwxPingPong(o, true);
    bool ok = true;
    for (int i = 0; i < kLatRows; ++i) {
      const LatResult& r = res[i];
      if (!r.ok) {
        lat_[i].failures.push_back(r.error);
        ok = false;
        std::printf("  [round %d] %s: FAIL: %s\n", rep + 1, lat_[i].name.c_str(),
                    r.error.c_str());
        continue;
      }
      lat_[i].values.push_back(r.median_us);
      lat_[i].foreign.push_back(r.foreign_cores);
      p99_[i].values.push_back(r.p99_us);
      cpu_[i].values.push_back(r.cpu_us_per_rtt);
      std::printf("  [round %d] %-60s %7.2f us  p99 %8.2f  n %6zu  foreign %.2f\n",
                  rep + 1, kNames[i], r.median_us, r.p99_us, r.samples, r.foreign_cores);
    }
    for (int k = 0; k < 2; ++k) {
      const LatResult& s = res[kSiwxOff + k];
      if (!s.ok) continue;
      if (res[kTcpBlocking].ok) {
        lat_[kSiwxOff + k].ratios.push_back(s.median_us / res[kTcpBlocking].median_us);
      }
      if (res[kTcpSameThreading].ok) {
        vs_same_[k].ratios.push_back(s.median_us / res[kTcpSameThreading].median_us);
      }
      if (res[kTcpBusy].ok) {
        vs_busy_[k].ratios.push_back(s.median_us / res[kTcpBusy].median_us);
      }
    }
    std::fflush(stdout);
    return ok;
  }

  void Print() const {
    for (int i = 0; i < kLatRows; ++i) {
      PrintRow(lat_[i]);
      PrintRow(p99_[i]);
      PrintRow(cpu_[i]);
      if (i == kSiwxOff || i == kSiwxOn) {
        PrintRow(vs_same_[i - kSiwxOff]);
        PrintRow(vs_busy_[i - kSiwxOff]);
      }
    }
  }

  void PrintFailures() const {
    for (const Row& r : lat_) PrintRowFailures(r);
  }

 private:
  enum LatIndex { kTcpBlocking, kTcpSameThreading, kTcpBusy, kSiwxOff, kSiwxOn, kLatRows };
  static constexpr const char* kNames[kLatRows] = {
      "(3) TCP ping-pong 8 B, blocking, 2 threads",
      "(3b) TCP 8 B, same threading as (4) (app spins, agent recv)",
      "(3c) TCP ping-pong 8 B, busy-poll recv (floor)",
      "(4) siwx 8 B Write ping-pong, CRC off",
      "(4) siwx 8 B Write ping-pong, CRC on",
  };

  std::array<Row, kLatRows> lat_;
  std::array<Row, kLatRows> p99_;
  std::array<Row, kLatRows> cpu_;
  std::array<Row, 2> vs_same_;
  std::array<Row, 2> vs_busy_;
};

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

  BandwidthTable bw(o);
  LatencyTable lat;
  bool any_failure = false;
  const auto t_start = Clock::now();
  for (int rep = 0; rep < o.reps; ++rep) {
    if (o.run_bw && !bw.RunRound(o, rep)) any_failure = true;
    if (o.run_lat && !lat.RunRound(o, rep)) any_failure = true;
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
  if (o.run_bw) bw.Print();
  if (o.run_lat) lat.Print();
  if (o.run_bw) bw.PrintDiagnostics();

  if (any_failure) {
    std::printf("\nFAILURES (a broken run reports no figure):\n");
    bw.PrintFailures();
    lat.PrintFailures();
    return 1;
  }
  std::printf("\nall siwx runs passed their data checks\n");
  return 0;
}

}  // namespace
}  // namespace siwx::bench

int main(int argc, char** argv) { return siwx::bench::Main(argc, argv); }
