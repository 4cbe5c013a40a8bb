// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Helpers for the CM tests: event waiting with a deadline, raw TCP peers
// that speak (or mangle) MPA by hand, and descriptor/thread counting for
// leak checks.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "rdmacm-ext/siwx_cm.h"

namespace siwx::cm::test {

using Bytes = std::vector<std::uint8_t>;
using namespace std::chrono_literals;

inline Bytes Concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline Bytes Ascii(const char* s) { return Bytes(s, s + std::strlen(s)); }

// Entries of a /proc/self directory (fd or task).
inline int CountEntries(const char* path) {
  DIR* d = opendir(path);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - (std::strcmp(path, "/proc/self/fd") == 0 ? 1 : 0);  // opendir's own fd
}
inline int CountFds() { return CountEntries("/proc/self/fd"); }
inline int CountThreads() { return CountEntries("/proc/self/task"); }

// The names of this process's threads, sorted and joined by spaces (siwx
// names its own: siwx-progress, siwx-cm, siwx-oob-*, ...), for messages.
inline std::string ThreadNames() {
  std::vector<std::string> names;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return "?";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
  return out;
}

inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A copy of an event's fields; the event itself is acked.
struct EventCopy {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = 0;
  rdma_cm_id* id = nullptr;
  rdma_cm_id* listen_id = nullptr;
  Bytes private_data;
  int responder_resources = 0;
  int initiator_depth = 0;
};

// Waits up to `limit` for the next event on `channel`.
inline std::optional<EventCopy> NextEvent(rdma_event_channel* channel,
                                          std::chrono::milliseconds limit = 3000ms) {
  pollfd p{channel->fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(limit.count())) != 1) return std::nullopt;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(channel, &ev) != 0) return std::nullopt;
  EventCopy c;
  c.type = ev->event;
  c.status = ev->status;
  c.id = ev->id;
  c.listen_id = ev->listen_id;
  const auto* pd = static_cast<const std::uint8_t*>(ev->param.conn.private_data);
  if (pd != nullptr) c.private_data.assign(pd, pd + ev->param.conn.private_data_len);
  c.responder_resources = ev->param.conn.responder_resources;
  c.initiator_depth = ev->param.conn.initiator_depth;
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  return c;
}

// Next event, which must be `type`.
inline EventCopy Expect(rdma_event_channel* channel, rdma_cm_event_type type,
                        std::chrono::milliseconds limit = 3000ms) {
  std::optional<EventCopy> e = NextEvent(channel, limit);
  EXPECT_TRUE(e.has_value()) << "no event within " << limit.count() << " ms, wanted "
                             << rdma_event_str(type);
  if (!e) return {};
  EXPECT_EQ(e->type, type) << "got " << rdma_event_str(e->type) << " status " << e->status
                           << ", wanted " << rdma_event_str(type);
  return *e;
}

inline sockaddr_in Loopback4(std::uint16_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

inline sockaddr_in6 Loopback6(std::uint16_t port = 0) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  a.sin6_port = htons(port);
  return a;
}

inline std::uint16_t SrcPort(rdma_cm_id* id) { return ntohs(rdma_get_src_port(id)); }

// Per-id MPA options with the given changes.
inline void SetOptions(rdma_cm_id* id, const std::function<void(siwx_cm_mpa_options&)>& change) {
  siwx_cm_mpa_options o{};
  o.size = sizeof(o);
  ASSERT_EQ(siwx_cm_get_mpa_options(id, &o), 0);
  change(o);
  ASSERT_EQ(siwx_cm_set_mpa_options(id, &o), 0) << "errno " << errno;
}

inline void ShortTimeouts(rdma_cm_id* id, std::uint32_t mpa_ms = 300,
                          std::uint32_t connect_ms = 500) {
  SetOptions(id, [&](siwx_cm_mpa_options& o) {
    o.mpa_timeout_ms = mpa_ms;
    o.connect_timeout_ms = connect_ms;
  });
}

inline siwx_cm_conn_info Info(rdma_cm_id* id) {
  siwx_cm_conn_info info{};
  info.size = sizeof(info);
  EXPECT_EQ(siwx_cm_connection_info(id, &info), 0) << "errno " << errno;
  return info;
}

// ---- Raw TCP peers ----

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    Reset();
    fd_ = o.fd_;
    o.fd_ = -1;
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Close with RST.
  void Abort() {
    if (fd_ < 0) return;
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Reset();
  }

 private:
  int fd_ = -1;
};

// A listening socket on 127.0.0.1, ephemeral port.
inline Fd RawListen(std::uint16_t* port, int backlog = 16) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Loopback4();
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd.get(), backlog), 0);
  socklen_t len = sizeof(a);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

inline Fd RawAccept(const Fd& listener, std::chrono::milliseconds limit = 3000ms) {
  pollfd p{listener.get(), POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(limit.count())) != 1) return Fd();
  return Fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
}

inline Fd RawConnect(std::uint16_t port) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a = Loopback4(port);
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

inline void WriteAll(const Fd& fd, const Bytes& b) {
  std::size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = send(fd.get(), b.data() + done, b.size() - done, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << "errno " << errno;
    done += static_cast<std::size_t>(n);
  }
}

// Reads exactly n octets or returns what came before EOF/timeout.
inline Bytes ReadN(const Fd& fd, std::size_t n, std::chrono::milliseconds limit = 3000ms) {
  Bytes out;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    std::uint8_t buf[1024];
    const ssize_t got = recv(fd.get(), buf, std::min(sizeof(buf), n - out.size()), 0);
    if (got <= 0) break;
    out.insert(out.end(), buf, buf + got);
  }
  return out;
}

// Waits for EOF or reset; true if the peer closed within `limit`.
inline bool WaitClosed(const Fd& fd, std::chrono::milliseconds limit = 3000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    std::uint8_t buf[256];
    const ssize_t got = recv(fd.get(), buf, sizeof(buf), 0);
    if (got <= 0) return true;
  }
}

// ---- MPA frames by hand (RFC 5044 7.1.1, RFC 6581 6 and 9) ----

inline Bytes RequestKey() { return Ascii("MPA ID Req Frame"); }
inline Bytes ReplyKey() { return Ascii("MPA ID Rep Frame"); }
inline Bytes RtrKey() { return Ascii("MPA ID RtR Frame"); }

// Key, then |M|C|R|S|Res|Rev| and PD_Length as two big-endian 16-bit words.
inline Bytes Frame(const Bytes& key, std::uint16_t flags_rev, std::uint16_t pd_length,
                   const Bytes& pd = {}) {
  Bytes b = key;
  b.push_back(static_cast<std::uint8_t>(flags_rev >> 8));
  b.push_back(static_cast<std::uint8_t>(flags_rev));
  b.push_back(static_cast<std::uint8_t>(pd_length >> 8));
  b.push_back(static_cast<std::uint8_t>(pd_length));
  b.insert(b.end(), pd.begin(), pd.end());
  return b;
}

// RFC 6581 9: |A|B| IRD (14) |C|D| ORD (14)|.
inline Bytes IrdOrd(std::uint16_t ird_word, std::uint16_t ord_word) {
  return {static_cast<std::uint8_t>(ird_word >> 8), static_cast<std::uint8_t>(ird_word),
          static_cast<std::uint8_t>(ord_word >> 8), static_cast<std::uint8_t>(ord_word)};
}

// ---- CM fixtures ----

// A listener on 127.0.0.1 (ephemeral port) with its own channel.
struct Listener {
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  std::uint16_t port = 0;

  void Start(int backlog = 8, const std::function<void(rdma_cm_id*)>& configure = nullptr) {
    channel = rdma_create_event_channel();
    ASSERT_NE(channel, nullptr);
    ASSERT_EQ(rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP), 0);
    if (configure) configure(id);
    sockaddr_in a = Loopback4();
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0);
    ASSERT_EQ(rdma_listen(id, backlog), 0);
    port = SrcPort(id);
    ASSERT_NE(port, 0);
  }
  void Stop() {
    if (id != nullptr) {
      EXPECT_EQ(rdma_destroy_id(id), 0);
    }
    id = nullptr;
    if (channel != nullptr) rdma_destroy_event_channel(channel);
    channel = nullptr;
  }
  ~Listener() { Stop(); }
};

// An active id whose route to 127.0.0.1:port is resolved.
struct Client {
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;

  void Resolve(std::uint16_t port, const std::function<void(rdma_cm_id*)>& configure = nullptr) {
    channel = rdma_create_event_channel();
    ASSERT_NE(channel, nullptr);
    ASSERT_EQ(rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP), 0);
    if (configure) configure(id);
    sockaddr_in dst = Loopback4(port);
    ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
    Expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
    ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
    Expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
  }
  int Connect(const Bytes& pd = {}, std::uint8_t resp_res = 1, std::uint8_t init_depth = 1) {
    rdma_conn_param p{};
    p.private_data = pd.empty() ? nullptr : pd.data();
    p.private_data_len = static_cast<std::uint8_t>(pd.size());
    p.responder_resources = resp_res;
    p.initiator_depth = init_depth;
    return rdma_connect(id, &p);
  }
  void Stop() {
    if (id != nullptr) {
      EXPECT_EQ(rdma_destroy_id(id), 0);
    }
    id = nullptr;
    if (channel != nullptr) rdma_destroy_event_channel(channel);
    channel = nullptr;
  }
  ~Client() { Stop(); }
};

// Why a test that needs siwx devices cannot run here, or nothing: outside
// siwx-run the device list is empty. With `needs_stream_binding`, the
// provider must also take streams by QP number (not the CM-only mode).
inline std::optional<std::string> MissingSiwxDevice(bool needs_stream_binding = false) {
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  rdma_free_devices(list);
  if (n == 0) return "no siwx device (run under siwx-run)";
  if (needs_stream_binding && dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream_num") == nullptr) {
    return "the provider does not take streams (CM-only mode)";
  }
  return std::nullopt;
}

// Records descriptor and thread counts with no id alive, and checks that
// a test gave everything back.
class LeakCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    // Warm up the one-time state (configuration, device registry) so it is
    // part of the baseline.
    rdma_event_channel* ch = rdma_create_event_channel();
    ASSERT_NE(ch, nullptr);
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in a = Loopback4();
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0);
    ASSERT_EQ(rdma_destroy_id(id), 0);
    rdma_destroy_event_channel(ch);
    // A thread the previous test's teardown set going may still be on its
    // way out (its ExpectNoLeaks saw the count it started with); wait until
    // the count holds for 100 ms, so it is not taken into the baseline.
    threads_ = CountThreads();
    thread_names_ = ThreadNames();
    const auto settle_end = std::chrono::steady_clock::now() + 2000ms;
    for (auto held_since = std::chrono::steady_clock::now();
         std::chrono::steady_clock::now() - held_since < 100ms &&
         std::chrono::steady_clock::now() < settle_end;) {
      std::this_thread::sleep_for(10ms);
      const int now = CountThreads();
      if (now != threads_) {
        threads_ = now;
        thread_names_ = ThreadNames();
        held_since = std::chrono::steady_clock::now();
      }
    }
    fds_ = CountFds();
  }
  // Call at the end of a test, after everything was destroyed.
  void ExpectNoLeaks() {
    EXPECT_TRUE(WaitFor([&] { return CountFds() == fds_; }, 4000ms))
        << "descriptors: " << CountFds() << " now, " << fds_ << " before";
    EXPECT_TRUE(WaitFor([&] { return CountThreads() == threads_; }, 4000ms))
        << "threads: " << CountThreads() << " now (" << ThreadNames() << "), " << threads_
        << " before (" << thread_names_ << ")";
  }

  int fds_ = 0;
  int threads_ = 0;
  std::string thread_names_;
};

}  // namespace siwx::cm::test
