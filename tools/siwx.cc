// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// `siwx`: what siwx is doing on this machine.
//
//   siwx devices       the siwx devices processes get (one per interface with
//                      an address, found as the shim finds them), with their
//                      addresses, MTU and port state
//   siwx stat [PID]    per process using siwx and per QP: state, addresses,
//                      what MPA negotiated, FPDUs and octets each way,
//                      Terminates, TCP retransmits, completion errors
//
// `stat` reads the statistics files the processes keep (common/stats); it
// needs no privileges for the caller's own processes.
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/engine/qp_state.h"
#include "common/engine/stream_params.h"
#include "common/stats/stats_file.h"
#include "common/transport/endpoints.h"
#include "common/wire/terminate.h"
#include "kernel-shim/netdev.h"
#include "tools/tcp_diag.h"

namespace siwx::tools {
namespace {

constexpr const char* kUsage =
    "usage: siwx devices\n"
    "       siwx stat [PID]\n"
    "       siwx --help\n"
    "\n"
    "devices   list the siwx devices (one per network interface with an address)\n"
    "stat      per process using siwx and per QP: state, peer, negotiated MPA\n"
    "          parameters, FPDUs and octets each way, Terminates, TCP retransmits,\n"
    "          completion errors; only the process PID when given\n"
    "\n"
    "See siwx(7).\n";

int Devices() {
  const std::optional<std::vector<shim::Netdev>> netdevs = shim::DiscoverNetdevs();
  if (!netdevs) {
    std::fprintf(stderr, "siwx: cannot read the network interfaces over netlink (see the "
                         "message above); check that NETLINK_ROUTE is usable here\n");
    return 1;
  }
  std::printf("%-20s %-16s %-7s %6s  %s\n", "device", "interface", "port", "mtu", "addresses");
  for (const shim::Netdev& dev : *netdevs) {
    std::string addresses;
    for (const std::string& a : dev.addresses) {
      if (!addresses.empty()) addresses += ' ';
      addresses += a;
    }
    std::printf("%-20s %-16s %-7s %6u  %s\n", ("siwx_" + dev.name).c_str(), dev.name.c_str(),
                dev.up ? "ACTIVE" : "DOWN", dev.mtu, addresses.c_str());
  }
  return 0;
}

const char* OnOff(std::uint8_t v) { return v != 0 ? "on" : "off"; }

std::string CauseText(const stats::CauseRecord& c) {
  if (c.valid == 0) return "none";
  return rdmap::DescribeTerminateCause(rdmap::TerminateCause{c.layer, c.etype, c.ecode});
}

const char* RtrText(std::uint8_t role) {
  switch (static_cast<engine::RtrRole>(role)) {
    case engine::RtrRole::kNone: return "none";
    case engine::RtrRole::kSend: return "sends";
    case engine::RtrRole::kAwait: return "awaits";
  }
  return "?";
}

void PrintQp(const stats::QpSnapshot& q) {
  const stats::QpDescription& d = q.description;
  const std::string_view state =
      q.state < engine::kQpStateCount ? engine::QpStateName(static_cast<engine::QpState>(q.state))
                                      : std::string_view("?");
  std::printf("  QP %" PRIu32 ": state %.*s", q.qp_num, static_cast<int>(state.size()),
              state.data());
  if (d.bound == 0) {
    std::printf(", no stream bound\n");
    return;
  }
  std::printf(", local %s, peer %s\n", transport::FormatEndpoint(d.local).c_str(),
              transport::FormatEndpoint(d.peer).c_str());
  std::printf("    mpa: %s, Rev %u, CRC %s, markers tx %s rx %s, large FPDUs %s, IRD %u, "
              "ORD %u, max ULPDU %u, RTR %s\n",
              engine::MpaDialectLabel(d.mpa_dialect), static_cast<unsigned>(d.mpa_revision),
              OnOff(d.crc), OnOff(d.tx_markers), OnOff(d.rx_markers), OnOff(d.large_fpdus),
              d.ird, d.ord, d.max_ulpdu, RtrText(d.rtr_role));
  std::printf("    tx: %" PRIu64 " FPDUs, %" PRIu64 " octets, %" PRIu64 " sendmsg\n", q.tx_fpdus,
              q.tx_octets, q.tx_syscalls);
  std::printf("    rx: %" PRIu64 " FPDUs, %" PRIu64 " octets, %" PRIu64 " recvmsg\n", q.rx_fpdus,
              q.rx_octets, q.rx_syscalls);
  const std::optional<TcpDiag> tcp = QueryTcpDiag(d.local, d.peer);
  if (tcp) {
    std::printf("    tcp: %" PRIu32 " retransmits, rtt %" PRIu32 " us\n", tcp->total_retransmits,
                tcp->rtt_us);
  } else {
    std::printf("    tcp: connection not visible (closed, or in another network namespace)\n");
  }
  std::printf("    completions: %" PRIu64 " errors, %" PRIu64 " flushed\n", q.completion_errors,
              q.completions_flushed);
  std::printf("    terminate sent: %s\n", CauseText(d.terminate_sent).c_str());
  std::printf("    terminate received: %s\n", CauseText(d.terminate_received).c_str());
  if (d.local_error.valid != 0) {
    std::printf("    failed without a Terminate: %s\n", CauseText(d.local_error).c_str());
  }
}

int Stat(int only_pid) {
  std::vector<int> pids;
  if (only_pid > 0) {
    pids.push_back(only_pid);
  } else {
    DIR* dir = opendir(stats::kStatsDirectory);
    if (dir == nullptr) {
      std::fprintf(stderr, "siwx: cannot list %s: %s\n", stats::kStatsDirectory,
                   std::strerror(errno));
      return 1;
    }
    while (const dirent* entry = readdir(dir)) {
      int pid = 0;
      if (stats::ParseStatsFileName(entry->d_name, &pid)) pids.push_back(pid);
    }
    closedir(dir);
  }
  int shown = 0;
  int unreadable = 0;
  for (int pid : pids) {
    const std::string path = stats::StatsPathFor(pid);
    stats::ProcessSnapshot snapshot;
    int error = 0;
    switch (stats::ReadStatsFile(path, &snapshot, &error)) {
      case stats::ReadStatus::kOk:
        break;
      case stats::ReadStatus::kStale:
        // Its process died without removing it: clean up when we may.
        unlink(path.c_str());
        if (only_pid > 0) {
          std::fprintf(stderr, "siwx: process %d is gone (stale %s removed)\n", pid,
                       path.c_str());
          return 1;
        }
        continue;
      case stats::ReadStatus::kNotAStatsFile:
        if (only_pid > 0) {
          std::fprintf(stderr, "siwx: %s is not a siwx statistics file of this version\n",
                       path.c_str());
          return 1;
        }
        continue;
      case stats::ReadStatus::kUnreadable:
        if (only_pid > 0) {
          std::fprintf(stderr,
                       "siwx: no statistics of process %d (%s: %s); is it using siwx, with "
                       "SIWX_STATS on? Another user's processes need root\n",
                       pid, path.c_str(), std::strerror(error));
          return 1;
        }
        ++unreadable;
        continue;
    }
    ++shown;
    std::printf("process %d (%s): %zu QP%s", snapshot.pid, snapshot.comm.c_str(),
                snapshot.qps.size(), snapshot.qps.size() == 1 ? "" : "s");
    if (snapshot.qps_without_slot != 0) {
      std::printf(", %" PRIu64 " more without a statistics slot", snapshot.qps_without_slot);
    }
    std::printf("\n");
    for (const stats::QpSnapshot& q : snapshot.qps) PrintQp(q);
  }
  if (shown == 0) {
    std::printf("no process is using siwx%s\n",
                unreadable > 0 ? " (among those whose statistics this user may read)" : "");
  }
  return 0;
}

}  // namespace
}  // namespace siwx::tools

int main(int argc, char** argv) {
  using namespace siwx::tools;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "devices" && argc == 2) return Devices();
  if (command == "stat" && argc <= 3) {
    int pid = 0;
    if (argc == 3) {
      char* end = nullptr;
      const long value = std::strtol(argv[2], &end, 10);
      if (*end != '\0' || value <= 0 || value > 0x3fffffff) {
        std::fprintf(stderr, "siwx: '%s' is not a process id\n%s", argv[2], kUsage);
        return 2;
      }
      pid = static_cast<int>(value);
    }
    return Stat(pid);
  }
  std::fprintf(stderr, "siwx: unknown command or arguments: '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
