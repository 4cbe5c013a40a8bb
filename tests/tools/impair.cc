// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// impair: a userspace network impairment for the two-host tests. Kernels
// without sch_netem (the CI machine's) still have the iptables NFQUEUE
// target: iptables hands every TCP packet of the veth link to this program, which
// gives each one its verdict — drop it, hold it and release it later,
// release it twice, or change it — and prints what it did when it ends.
//
// What it can do to the packets of the queue (IPv4 TCP; anything else
// passes untouched):
//   --loss PCT          drop PCT % of them
//   --delay MS          hold each one MS milliseconds (order kept)
//   --reorder PCT       hold PCT % of them --reorder-ms longer, so later
//                       packets overtake them
//   --duplicate PCT     release PCT % of them twice (the copy is sent on a
//                       raw socket with --mark, which the iptables rules
//                       let through without queueing it again)
//   --flip PCT          flip one bit of the TCP payload of PCT % of the
//                       packets that carry payload, at most --flip-count
//                       times, never in the first --flip-skip octets of a
//                       direction of a connection (the MPA startup frames,
//                       which no CRC covers), and recompute the TCP
//                       checksum: the receiving TCP accepts the octets, so
//                       only the MPA CRC can notice
//   --rst-after-ms MS   turn the first payload-carrying packet after MS
//                       milliseconds into an RST (same sequence number, no
//                       payload): the receiver drops the connection
//   --partition-after-ms MS --partition-ms D
//                       drop every packet in [MS, MS + D)
// It stops by itself after --seconds (or on SIGTERM/SIGINT): it releases
// what it holds, prints one "impair: counters" line and exits 0. Fault
// events are printed as they happen with the CLOCK_REALTIME time in
// milliseconds (at_ms=...), so a test can time what follows them.
//
// One thread; everything happens in the poll loop of main().
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int queue = 0;
  double seconds = 60;
  double loss = 0;
  int delay_ms = 0;
  double reorder = 0;
  int reorder_ms = 10;
  double duplicate = 0;
  double flip = 0;
  long flip_count = -1;  // -1: no limit
  std::uint32_t flip_skip = 4096;
  long rst_after_ms = -1;
  long partition_after_ms = -1;
  long partition_ms = 0;
  std::uint32_t mark = 0x5157;
  std::uint64_t seed = 1;
};

struct Counters {
  std::uint64_t seen = 0;
  std::uint64_t seen_octets = 0;
  std::uint64_t passed = 0;
  std::uint64_t lost = 0;
  std::uint64_t delayed = 0;
  std::uint64_t reordered = 0;
  std::uint64_t duplicated = 0;
  std::uint64_t flipped = 0;
  std::uint64_t rst_injected = 0;
  std::uint64_t partition_dropped = 0;
  std::uint64_t queue_overruns = 0;  // ENOBUFS: the kernel dropped packets for us
  std::uint64_t not_tcp = 0;
};

// A packet waiting for its release time; `data` is what goes out.
struct Held {
  Clock::time_point release;
  std::uint64_t order = 0;
  std::uint32_t id = 0;
  bool duplicate = false;
  std::vector<std::uint8_t> data;
  bool operator>(const Held& other) const {
    return std::tie(release, order) > std::tie(other.release, other.order);
  }
};

// One direction of one TCP connection, keyed by addresses and ports.
using FlowKey = std::tuple<std::uint32_t, std::uint32_t, std::uint16_t, std::uint16_t>;

struct State {
  Options options;
  Counters counters;
  Clock::time_point start = Clock::now();
  std::mt19937_64 rng;
  nfq_q_handle* queue = nullptr;
  int raw_fd = -1;
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held;
  std::uint64_t next_order = 0;
  std::map<FlowKey, std::uint32_t> first_data_seq;  // from each direction's SYN
  bool partition_reported_start = false;
  bool partition_reported_end = false;
};

volatile sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

long long RealtimeMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

long ElapsedMs(const State& s) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - s.start).count());
}

bool Chance(State& s, double percent) {
  if (percent <= 0) return false;
  return std::uniform_real_distribution<double>(0, 100)(s.rng) < percent;
}

std::uint32_t Sum16(const std::uint8_t* p, std::size_t n, std::uint32_t sum) {
  for (std::size_t i = 0; i + 1 < n; i += 2) sum += static_cast<std::uint32_t>(p[i] << 8 | p[i + 1]);
  if (n % 2 == 1) sum += static_cast<std::uint32_t>(p[n - 1] << 8);
  return sum;
}

std::uint16_t Fold(std::uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum & 0xFFFF);
}

// Recomputes the IPv4 header checksum and the TCP checksum (RFC 793
// pseudo-header) of a whole packet.
void FixChecksums(std::vector<std::uint8_t>& pkt) {
  const std::size_t ihl = (pkt[0] & 0x0F) * 4u;
  pkt[10] = pkt[11] = 0;
  const std::uint16_t ip_sum = Fold(Sum16(pkt.data(), ihl, 0));
  pkt[10] = static_cast<std::uint8_t>(ip_sum >> 8);
  pkt[11] = static_cast<std::uint8_t>(ip_sum);
  const std::size_t tcp_len = pkt.size() - ihl;
  std::uint8_t* tcp = pkt.data() + ihl;
  tcp[16] = tcp[17] = 0;
  std::uint32_t sum = Sum16(pkt.data() + 12, 8, 0);  // source and destination address
  sum += IPPROTO_TCP;
  sum += static_cast<std::uint32_t>(tcp_len);
  const std::uint16_t tcp_sum = Fold(Sum16(tcp, tcp_len, sum));
  tcp[16] = static_cast<std::uint8_t>(tcp_sum >> 8);
  tcp[17] = static_cast<std::uint8_t>(tcp_sum);
}

std::uint32_t Be32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) << 24 | static_cast<std::uint32_t>(p[1]) << 16 |
         static_cast<std::uint32_t>(p[2]) << 8 | p[3];
}
std::uint16_t Be16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }

void Hold(State& s, std::uint32_t id, std::vector<std::uint8_t> data, int extra_ms, bool duplicate) {
  Held h;
  h.release = Clock::now() + std::chrono::milliseconds(s.options.delay_ms + extra_ms);
  h.order = s.next_order++;
  h.id = id;
  h.duplicate = duplicate;
  h.data = std::move(data);
  s.held.push(std::move(h));
}

void Release(State& s, const Held& h) {
  nfq_set_verdict(s.queue, h.id, NF_ACCEPT, static_cast<std::uint32_t>(h.data.size()), h.data.data());
  ++s.counters.passed;
  if (!h.duplicate) return;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  std::memcpy(&to.sin_addr, h.data.data() + 16, 4);
  if (sendto(s.raw_fd, h.data.data(), h.data.size(), 0, reinterpret_cast<sockaddr*>(&to),
             sizeof(to)) == static_cast<ssize_t>(h.data.size())) {
    ++s.counters.duplicated;
  }
}

// Decides one packet's fate.
int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* arg) {
  State& s = *static_cast<State*>(arg);
  const nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph == nullptr) return 0;
  const std::uint32_t id = ntohl(ph->packet_id);
  unsigned char* raw = nullptr;
  const int len = nfq_get_payload(nfa, &raw);
  ++s.counters.seen;
  if (len <= 0) {
    nfq_set_verdict(s.queue, id, NF_ACCEPT, 0, nullptr);
    return 0;
  }
  s.counters.seen_octets += static_cast<std::uint64_t>(len);
  std::vector<std::uint8_t> pkt(raw, raw + len);
  const std::size_t ihl = len >= 20 ? (pkt[0] & 0x0F) * 4u : 0;
  if (len < 20 || (pkt[0] >> 4) != 4 || pkt[9] != IPPROTO_TCP || static_cast<std::size_t>(len) < ihl + 20) {
    ++s.counters.not_tcp;
    nfq_set_verdict(s.queue, id, NF_ACCEPT, 0, nullptr);
    return 0;
  }
  const Options& o = s.options;
  const long now_ms = ElapsedMs(s);

  // Partition: nothing gets through.
  if (o.partition_after_ms >= 0 && now_ms >= o.partition_after_ms &&
      now_ms < o.partition_after_ms + o.partition_ms) {
    if (!s.partition_reported_start) {
      s.partition_reported_start = true;
      std::printf("impair: event partition_start at_ms=%lld\n", RealtimeMs());
      std::fflush(stdout);
    }
    ++s.counters.partition_dropped;
    nfq_set_verdict(s.queue, id, NF_DROP, 0, nullptr);
    return 0;
  }
  if (s.partition_reported_start && !s.partition_reported_end) {
    s.partition_reported_end = true;
    std::printf("impair: event partition_end at_ms=%lld\n", RealtimeMs());
    std::fflush(stdout);
  }

  std::uint8_t* tcp = pkt.data() + ihl;
  const std::size_t doff = (tcp[12] >> 4) * 4u;
  const std::size_t payload_at = ihl + doff;
  const std::size_t payload_len = pkt.size() > payload_at ? pkt.size() - payload_at : 0;
  const FlowKey key{Be32(pkt.data() + 12), Be32(pkt.data() + 16), Be16(tcp), Be16(tcp + 2)};
  const std::uint32_t seq = Be32(tcp + 4);
  if ((tcp[13] & TH_SYN) != 0) s.first_data_seq[key] = seq + 1;

  // RST injection: this packet's payload is dropped and the receiver reset.
  if (o.rst_after_ms >= 0 && s.counters.rst_injected == 0 && now_ms >= o.rst_after_ms &&
      payload_len > 0) {
    pkt.resize(payload_at);
    tcp = pkt.data() + ihl;
    tcp[13] = TH_RST | TH_ACK;
    pkt[2] = static_cast<std::uint8_t>(pkt.size() >> 8);
    pkt[3] = static_cast<std::uint8_t>(pkt.size());
    FixChecksums(pkt);
    ++s.counters.rst_injected;
    char from[INET_ADDRSTRLEN], to[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, pkt.data() + 12, from, sizeof(from));
    inet_ntop(AF_INET, pkt.data() + 16, to, sizeof(to));
    std::printf("impair: event rst from=%s:%u to=%s:%u at_ms=%lld\n", from, Be16(tcp), to,
                Be16(tcp + 2), RealtimeMs());
    std::fflush(stdout);
    nfq_set_verdict(s.queue, id, NF_ACCEPT, static_cast<std::uint32_t>(pkt.size()), pkt.data());
    ++s.counters.passed;
    return 0;
  }

  if (Chance(s, o.loss)) {
    ++s.counters.lost;
    nfq_set_verdict(s.queue, id, NF_DROP, 0, nullptr);
    return 0;
  }

  // Bit flip, past the startup frames of a connection whose SYN we saw.
  if (payload_len > 0 && (o.flip_count < 0 || static_cast<long>(s.counters.flipped) < o.flip_count) &&
      Chance(s, o.flip)) {
    const auto it = s.first_data_seq.find(key);
    if (it != s.first_data_seq.end()) {
      const std::uint32_t offset = seq - it->second;  // stream offset of the first payload octet
      if (offset < (1u << 31)) {
        const std::uint64_t first = offset >= o.flip_skip ? 0 : o.flip_skip - offset;
        if (first < payload_len) {
          const std::uint64_t octet =
              first + std::uniform_int_distribution<std::uint64_t>(0, payload_len - 1 - first)(s.rng);
          const int bit = std::uniform_int_distribution<int>(0, 7)(s.rng);
          pkt[payload_at + octet] ^= static_cast<std::uint8_t>(1u << bit);
          FixChecksums(pkt);
          ++s.counters.flipped;
          std::printf("impair: event flip stream_offset=%llu bit=%d at_ms=%lld\n",
                      static_cast<unsigned long long>(offset + octet), bit, RealtimeMs());
          std::fflush(stdout);
        }
      }
    }
  }

  const bool duplicate = Chance(s, o.duplicate);
  int extra_ms = 0;
  if (Chance(s, o.reorder)) {
    extra_ms = o.reorder_ms;
    ++s.counters.reordered;
  }
  if (o.delay_ms > 0 || extra_ms > 0 || duplicate) {
    if (o.delay_ms > 0) ++s.counters.delayed;
    Hold(s, id, std::move(pkt), extra_ms, duplicate);
    return 0;
  }
  nfq_set_verdict(s.queue, id, NF_ACCEPT, static_cast<std::uint32_t>(pkt.size()), pkt.data());
  ++s.counters.passed;
  return 0;
}

void ReleaseDue(State& s, bool all) {
  const auto now = Clock::now();
  while (!s.held.empty() && (all || s.held.top().release <= now)) {
    Release(s, s.held.top());
    s.held.pop();
  }
}

[[noreturn]] void Usage(const char* what) {
  std::fprintf(stderr,
               "impair: %s\n"
               "usage: impair --queue N --seconds S [--loss PCT] [--delay MS] [--reorder PCT]\n"
               "  [--reorder-ms MS] [--duplicate PCT] [--flip PCT] [--flip-count N]\n"
               "  [--flip-skip OCTETS] [--rst-after-ms MS]\n"
               "  [--partition-after-ms MS --partition-ms D] [--mark M] [--seed N]\n",
               what);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + name).c_str());
    const char* value = argv[++i];
    char* end = nullptr;
    const double v = std::strtod(value, &end);
    if (end == value || *end != '\0' || v < 0) Usage(("bad value for " + name + ": " + value).c_str());
    if (name == "--queue") o.queue = static_cast<int>(v);
    else if (name == "--seconds") o.seconds = v;
    else if (name == "--loss") o.loss = v;
    else if (name == "--delay") o.delay_ms = static_cast<int>(v);
    else if (name == "--reorder") o.reorder = v;
    else if (name == "--reorder-ms") o.reorder_ms = static_cast<int>(v);
    else if (name == "--duplicate") o.duplicate = v;
    else if (name == "--flip") o.flip = v;
    else if (name == "--flip-count") o.flip_count = static_cast<long>(v);
    else if (name == "--flip-skip") o.flip_skip = static_cast<std::uint32_t>(v);
    else if (name == "--rst-after-ms") o.rst_after_ms = static_cast<long>(v);
    else if (name == "--partition-after-ms") o.partition_after_ms = static_cast<long>(v);
    else if (name == "--partition-ms") o.partition_ms = static_cast<long>(v);
    else if (name == "--mark") o.mark = static_cast<std::uint32_t>(v);
    else if (name == "--seed") o.seed = static_cast<std::uint64_t>(v);
    else Usage(("unknown option " + name).c_str());
  }
  if (o.seconds <= 0) Usage("--seconds must be positive");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  State s;
  s.options = Parse(argc, argv);
  s.rng.seed(s.options.seed);

  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    std::perror("impair: nfq_open (needs root and nfnetlink_queue)");
    return 1;
  }
  s.queue = nfq_create_queue(h, static_cast<std::uint16_t>(s.options.queue), &OnPacket, &s);
  if (s.queue == nullptr) {
    std::perror("impair: nfq_create_queue (is another program bound to the queue?)");
    return 1;
  }
  if (nfq_set_mode(s.queue, NFQNL_COPY_PACKET, 0xFFFF) < 0) {
    std::perror("impair: nfq_set_mode");
    return 1;
  }
  // Held packets count against the queue: room for a delay's worth.
  nfq_set_queue_maxlen(s.queue, 1 << 16);
  const int fd = nfq_fd(h);
  const int rcvbuf = 16 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
  s.raw_fd = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
  if (s.raw_fd < 0 || setsockopt(s.raw_fd, SOL_SOCKET, SO_MARK, &s.options.mark, sizeof(s.options.mark)) < 0) {
    std::perror("impair: raw socket for duplicates");
    return 1;
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  std::printf("impair: ready queue=%d at_ms=%lld\n", s.options.queue, RealtimeMs());
  std::fflush(stdout);

  const auto end = s.start + std::chrono::milliseconds(static_cast<long>(s.options.seconds * 1000));
  std::vector<char> buf(1 << 17);
  while (g_stop == 0 && Clock::now() < end) {
    auto wake = end;
    if (!s.held.empty()) wake = std::min(wake, s.held.top().release);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::max<long long>(0, std::min<long long>(wait + 1, 100))));
    for (;;) {
      const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0 && errno == ENOBUFS) {
        ++s.counters.queue_overruns;
        continue;
      }
      if (n <= 0) break;
      nfq_handle_packet(h, buf.data(), static_cast<int>(n));
    }
    ReleaseDue(s, false);
  }
  ReleaseDue(s, true);
  nfq_destroy_queue(s.queue);
  nfq_close(h);
  close(s.raw_fd);
  const Counters& c = s.counters;
  std::printf(
      "impair: counters seen=%llu octets=%llu passed=%llu lost=%llu delayed=%llu reordered=%llu "
      "duplicated=%llu flipped=%llu rst_injected=%llu partition_dropped=%llu queue_overruns=%llu "
      "not_tcp=%llu\n",
      static_cast<unsigned long long>(c.seen), static_cast<unsigned long long>(c.seen_octets),
      static_cast<unsigned long long>(c.passed), static_cast<unsigned long long>(c.lost),
      static_cast<unsigned long long>(c.delayed), static_cast<unsigned long long>(c.reordered),
      static_cast<unsigned long long>(c.duplicated), static_cast<unsigned long long>(c.flipped),
      static_cast<unsigned long long>(c.rst_injected),
      static_cast<unsigned long long>(c.partition_dropped),
      static_cast<unsigned long long>(c.queue_overruns), static_cast<unsigned long long>(c.not_tcp));
  return 0;
}
