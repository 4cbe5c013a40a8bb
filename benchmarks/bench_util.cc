// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "benchmarks/bench_util.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

namespace siwx::bench {

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

PageBuffer::PageBuffer(std::size_t size) : size_(size) {
  const std::size_t rounded = (std::max<std::size_t>(size, 1) + 4095) / 4096 * 4096;
  data_ = static_cast<std::uint8_t*>(std::aligned_alloc(4096, rounded));
  if (data_ == nullptr) {
    std::fprintf(stderr, "out of memory\n");
    std::exit(2);
  }
  std::memset(data_, 0, rounded);
}
PageBuffer::~PageBuffer() { std::free(data_); }

std::uint8_t PatternByte(std::uint32_t seed, std::size_t i) {
  return static_cast<std::uint8_t>(((i ^ (i >> 8)) * 167 + seed * 61 + (i >> 16)) & 0xFF);
}

void FillPattern(PageBuffer& b, std::uint32_t seed, std::uint8_t flip) {
  for (std::size_t i = 0; i < b.size(); ++i) b.data()[i] = PatternByte(seed, i) ^ flip;
}

std::optional<std::size_t> FirstMismatch(PageBuffer& b, std::uint32_t seed, std::uint8_t flip) {
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b.data()[i] != (PatternByte(seed, i) ^ flip)) return i;
  }
  return std::nullopt;
}

void SetTimeouts(int fd) {
  timeval tv{};
  tv.tv_sec = kStallTimeout.count();
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

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

bool RecvAll(int fd, std::uint8_t* p, std::size_t n, int flags) {
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

}  // namespace siwx::bench
