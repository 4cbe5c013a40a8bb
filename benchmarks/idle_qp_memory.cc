// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// idle_qp_memory: what an idle connected QP costs (issue 10: <= 64 KiB of
// memory and no thread). Prints figures; it is not a test.
//
// In one process it connects N QP pairs over rdma_cm on loopback (run it
// under siwx-run, so librdmacm and libibverbs are siwx's), optionally streams
// RDMA Writes through each pair first, lets them go idle and prints, per QP
// (each pair is two QPs): the heap in use (mallinfo2 uordblks + hblkhd), the
// resident set and the threads, as deltas against a baseline taken after a
// first warm-up pair (which opens the device and starts the engine). The CQs,
// PDs and the streaming buffers are made before the baseline too, so the
// figures are what the QPs, their CM ids and their streams cost.
//
//   siwx-run build/release/benchmarks/idle_qp_memory [--pairs N] [--stream BYTES]
//            [--reads IRD_ORD] [--queues SEND_WR,RECV_WR,SEND_SGE,RECV_SGE,INLINE]...
//
// Without --queues it measures two shapes: perftest's ib_write_bw defaults
// (128 send WRs, 1 receive WR, one SGE each, no inline data) and 64+64 WRs;
// --reads (default 16, perftest's outstanding Reads) is the IRD and ORD each
// side asks for.
#include <infiniband/verbs.h>
#include <malloc.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Shape {
  std::string name;
  ibv_qp_cap cap{};
};

struct Options {
  int pairs = 200;
  std::size_t stream_octets = 0;  // RDMA Write octets through each pair before it idles
  std::uint8_t reads = 16;        // responder_resources and initiator_depth (IRD, ORD)
  std::vector<Shape> shapes;
};

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "idle_qp_memory: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

void Usage() {
  std::fprintf(stderr,
               "usage: idle_qp_memory [--pairs N] [--stream BYTES] "
               "[--reads IRD_ORD] [--queues SEND_WR,RECV_WR,SEND_SGE,RECV_SGE,INLINE]...\n"
               "Run under siwx-run. Prints heap, RSS and threads per idle connected QP.\n");
  std::exit(2);
}

Shape MakeShape(const char* name, std::uint32_t send_wr, std::uint32_t recv_wr,
                std::uint32_t send_sge, std::uint32_t recv_sge, std::uint32_t inline_data) {
  Shape s;
  s.name = name;
  s.cap.max_send_wr = send_wr;
  s.cap.max_recv_wr = recv_wr;
  s.cap.max_send_sge = send_sge;
  s.cap.max_recv_sge = recv_sge;
  s.cap.max_inline_data = inline_data;
  return s;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--pairs") {
      o.pairs = std::atoi(v);
      if (o.pairs < 1) Usage();
    } else if (a == "--reads") {
      o.reads = static_cast<std::uint8_t>(std::atoi(v));
    } else if (a == "--stream") {
      o.stream_octets = std::strtoull(v, nullptr, 0);
    } else if (a == "--queues") {
      unsigned q[5] = {};
      if (std::sscanf(v, "%u,%u,%u,%u,%u", &q[0], &q[1], &q[2], &q[3], &q[4]) != 5) Usage();
      o.shapes.push_back(MakeShape(v, q[0], q[1], q[2], q[3], q[4]));
    } else {
      Usage();
    }
  }
  if (o.shapes.empty()) {
    // perftest ib_write_bw: tx depth 128, rx depth 1 for RDMA verbs, one
    // SGE, inline size 0 for bandwidth tests.
    o.shapes.push_back(MakeShape("ib_write_bw defaults 128,1,1,1,0", 128, 1, 1, 1, 0));
    o.shapes.push_back(MakeShape("64+64 WRs 64,64,1,1,0", 64, 64, 1, 1, 0));
  }
  return o;
}

struct Footprint {
  long long heap = 0;  // octets in use: arena + mmapped chunks
  long long rss = 0;   // octets resident
  int threads = 0;
};

Footprint Measure() {
  Footprint u;
  const struct mallinfo2 mi = mallinfo2();
  u.heap = static_cast<long long>(mi.uordblks + mi.hblkhd);
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  u.rss = static_cast<long long>(resident) * sysconf(_SC_PAGESIZE);
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) u.threads += e->d_name[0] != '.';
    closedir(d);
  }
  return u;
}

// Everything shared by the QPs of one side, made before the baseline.
struct Side {
  ibv_context* verbs = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<std::uint8_t> buffer;
  ibv_mr* mr = nullptr;
};

constexpr std::size_t kBufferOctets = 1 << 20;
constexpr std::size_t kWriteOctets = 64 * 1024;
constexpr int kCqDepth = 4096;

void SetUpSide(Side& side, ibv_context* verbs) {
  if (side.verbs != nullptr) return;
  side.verbs = verbs;
  side.pd = ibv_alloc_pd(verbs);
  if (side.pd == nullptr) Die("ibv_alloc_pd");
  side.cq = ibv_create_cq(verbs, kCqDepth, nullptr, nullptr, 0);
  if (side.cq == nullptr) Die("ibv_create_cq");
  side.buffer.assign(kBufferOctets, 0x5a);
  side.mr = ibv_reg_mr(side.pd, side.buffer.data(), side.buffer.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (side.mr == nullptr) Die("ibv_reg_mr");
}

rdma_cm_event* Expect(rdma_event_channel* channel, rdma_cm_event_type want, const char* what) {
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) Die("rdma_get_cm_event");
  if (event->event != want) {
    std::fprintf(stderr, "idle_qp_memory: %s: got %s (status %d), expected %s\n", what,
                 rdma_event_str(event->event), event->status, rdma_event_str(want));
    std::exit(1);
  }
  return event;
}

// The passive side: accepts every connect request on its own thread (a
// synchronous accept would wait for the active side).
class Server {
 public:
  Server() {
    channel_ = rdma_create_event_channel();
    if (channel_ == nullptr) Die("rdma_create_event_channel");
    if (rdma_create_id(channel_, &listen_, nullptr, RDMA_PS_TCP) != 0) Die("rdma_create_id");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rdma_bind_addr(listen_, reinterpret_cast<sockaddr*>(&addr)) != 0) Die("rdma_bind_addr");
    if (rdma_listen(listen_, 128) != 0) Die("rdma_listen");
    port_ = rdma_get_src_port(listen_);
  }

  std::uint16_t port() const { return port_; }  // network order
  // Made at the first connect request (a loopback listener has no device).
  const Side& side() {
    std::lock_guard lock(side_mutex_);
    return side_;
  }

  void Start(const ibv_qp_cap& cap, std::uint8_t reads) {
    cap_ = cap;
    reads_ = reads;
    thread_ = std::thread([this] { Run(); });
  }
  // Waits for the thread, which ends after `expected` disconnects.
  void Join() { thread_.join(); }
  void ExpectDisconnects(int n) { disconnects_left_ = n; }

  ~Server() {
    rdma_destroy_id(listen_);
    if (side_.verbs == nullptr) return;
    ibv_dereg_mr(side_.mr);
    ibv_destroy_cq(side_.cq);
    ibv_dealloc_pd(side_.pd);
    rdma_destroy_event_channel(channel_);
  }

 private:
  void Run() {
    while (disconnects_left_ > 0) {
      rdma_cm_event* event = nullptr;
      if (rdma_get_cm_event(channel_, &event) != 0) Die("server rdma_get_cm_event");
      rdma_cm_id* id = event->id;
      const rdma_cm_event_type type = event->event;
      const int status = event->status;
      rdma_ack_cm_event(event);
      switch (type) {
        case RDMA_CM_EVENT_CONNECT_REQUEST: {
          {
            std::lock_guard lock(side_mutex_);
            SetUpSide(side_, id->verbs);
          }
          ibv_qp_init_attr attr{};
          attr.send_cq = side_.cq;
          attr.recv_cq = side_.cq;
          attr.qp_type = IBV_QPT_RC;
          attr.cap = cap_;
          if (rdma_create_qp(id, side_.pd, &attr) != 0) Die("server rdma_create_qp");
          rdma_conn_param param{};
          param.responder_resources = reads_;
          param.initiator_depth = reads_;
          if (rdma_accept(id, &param) != 0) Die("rdma_accept");
          break;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
          break;
        case RDMA_CM_EVENT_DISCONNECTED:
          rdma_destroy_qp(id);
          rdma_destroy_id(id);
          --disconnects_left_;
          break;
        default:
          std::fprintf(stderr, "idle_qp_memory: server: unexpected %s (status %d)\n",
                       rdma_event_str(type), status);
          std::exit(1);
      }
    }
  }

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* listen_ = nullptr;
  std::uint16_t port_ = 0;
  std::mutex side_mutex_;
  Side side_;
  ibv_qp_cap cap_{};
  std::uint8_t reads_ = 0;
  std::atomic<int> disconnects_left_{0};
  std::thread thread_;
};

class Client {
 public:
  explicit Client(std::uint16_t port) : port_(port) {
    channel_ = rdma_create_event_channel();
    if (channel_ == nullptr) Die("rdma_create_event_channel");
  }
  ~Client() { rdma_destroy_event_channel(channel_); }

  Side& side() { return side_; }

  rdma_cm_id* Connect(const ibv_qp_cap& cap, std::uint8_t reads) {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP) != 0) Die("rdma_create_id");
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dst.sin_port = port_;
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) {
      Die("rdma_resolve_addr");
    }
    rdma_ack_cm_event(Expect(channel_, RDMA_CM_EVENT_ADDR_RESOLVED, "resolve_addr"));
    if (rdma_resolve_route(id, 2000) != 0) Die("rdma_resolve_route");
    rdma_ack_cm_event(Expect(channel_, RDMA_CM_EVENT_ROUTE_RESOLVED, "resolve_route"));
    if (id->verbs == nullptr) {
      std::fprintf(stderr, "idle_qp_memory: no RDMA device for 127.0.0.1: run under siwx-run\n");
      std::exit(1);
    }
    SetUpSide(side_, id->verbs);
    ibv_qp_init_attr attr{};
    attr.send_cq = side_.cq;
    attr.recv_cq = side_.cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap = cap;
    if (rdma_create_qp(id, side_.pd, &attr) != 0) Die("rdma_create_qp");
    rdma_conn_param param{};
    param.responder_resources = reads;
    param.initiator_depth = reads;
    if (rdma_connect(id, &param) != 0) Die("rdma_connect");
    rdma_ack_cm_event(Expect(channel_, RDMA_CM_EVENT_ESTABLISHED, "connect"));
    return id;
  }

  // RDMA Writes of 64 KiB into the server's buffer until `octets` went
  // through, with at most `depth` outstanding.
  void Stream(rdma_cm_id* id, const Side& server, std::size_t octets, std::uint32_t depth) {
    std::size_t posted = 0, done = 0;
    std::uint32_t outstanding = 0;
    std::size_t offset = 0;
    while (done < octets) {
      while (posted < octets && outstanding < depth) {
        const std::size_t n = std::min(kWriteOctets, octets - posted);
        if (offset + n > kBufferOctets) offset = 0;
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(side_.buffer.data() + offset),
                    static_cast<std::uint32_t>(n), side_.mr->lkey};
        ibv_send_wr wr{};
        wr.wr_id = n;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(server.buffer.data() + offset);
        wr.wr.rdma.rkey = server.mr->rkey;
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(id->qp, &wr, &bad) != 0) Die("ibv_post_send");
        posted += n;
        offset += n;
        ++outstanding;
      }
      ibv_wc wc[16];
      const int got = ibv_poll_cq(side_.cq, 16, wc);
      if (got < 0) Die("ibv_poll_cq");
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "idle_qp_memory: Write completed with %s\n",
                       ibv_wc_status_str(wc[i].status));
          std::exit(1);
        }
        done += wc[i].wr_id;
        --outstanding;
      }
    }
  }

  void Disconnect(rdma_cm_id* id) {
    if (rdma_disconnect(id) != 0) Die("rdma_disconnect");
    rdma_ack_cm_event(Expect(channel_, RDMA_CM_EVENT_DISCONNECTED, "disconnect"));
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }

  void TearDown() {
    ibv_dereg_mr(side_.mr);
    ibv_destroy_cq(side_.cq);
    ibv_dealloc_pd(side_.pd);
  }

 private:
  rdma_event_channel* channel_ = nullptr;
  std::uint16_t port_ = 0;
  Side side_;
};

void Settle() {
  // Let the progress thread finish what the streams left (completions,
  // acknowledgements) and give back what it caches.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  malloc_trim(0);
}

void RunShape(const Options& o, const Shape& shape) {
  Server server;
  Client client(server.port());
  server.ExpectDisconnects(o.pairs + 1);
  server.Start(shape.cap, o.reads);

  // Warm-up pair: opens the device on the client side, starts the engine.
  rdma_cm_id* warm = client.Connect(shape.cap, o.reads);
  if (o.stream_octets > 0) {
    client.Stream(warm, server.side(), o.stream_octets, shape.cap.max_send_wr);
  }
  Settle();
  const Footprint before = Measure();

  std::vector<rdma_cm_id*> ids;
  ids.reserve(static_cast<std::size_t>(o.pairs));
  for (int i = 0; i < o.pairs; ++i) {
    ids.push_back(client.Connect(shape.cap, o.reads));
    if (o.stream_octets > 0) {
      client.Stream(ids.back(), server.side(), o.stream_octets, shape.cap.max_send_wr);
    }
  }
  Settle();
  const Footprint after = Measure();

  const double qps = 2.0 * o.pairs;
  std::printf("%-34s pairs %d stream %zu: heap %.1f KiB/QP, RSS %.1f KiB/QP, threads %+d "
              "(%d -> %d)\n",
              shape.name.c_str(), o.pairs, o.stream_octets,
              static_cast<double>(after.heap - before.heap) / qps / 1024.0,
              static_cast<double>(after.rss - before.rss) / qps / 1024.0,
              after.threads - before.threads, before.threads, after.threads);
  std::fflush(stdout);

  for (rdma_cm_id* id : ids) client.Disconnect(id);
  client.Disconnect(warm);
  server.Join();
  client.TearDown();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  for (const Shape& shape : o.shapes) RunShape(o, shape);
  return 0;
}
