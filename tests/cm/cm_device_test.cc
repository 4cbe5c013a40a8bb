// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What needs a siwx device context: ids carrying the shared per-device
// ibv_context and PD (the same pointers rdma_get_devices returns), QPs made
// by rdma_create_qp, and the handover of established streams. ctest runs
// these under siwx-run (test cm_with_devices); without devices they skip.
#include <dlfcn.h>

#include <atomic>
#include <memory>

#include "common/engine/stream_params.h"
#include "common/wire/fpdu.h"
#include "rdmacm-ext/cm_core.h"
#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

// An RC QP with room for 4 WRs of one SGE each way: what these tests post.
ibv_qp_init_attr SmallRcQpAttr() {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return attr;
}

class CmDevice : public LeakCheck {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_context** list = rdma_get_devices(&n);
    for (int i = 0; i < n; ++i) devices_.push_back(list[i]);
    rdma_free_devices(list);
    if (devices_.empty()) GTEST_SKIP() << "no siwx device (run under siwx-run)";
    LeakCheck::SetUp();
  }
  // rdma_create_qp, skipping the test while the provider has no QPs or CQs
  // (EOPNOTSUPP from libibverbs' placeholder ops).
  bool CreateQp(rdma_cm_id* id, ibv_qp_init_attr* attr) {
    if (rdma_create_qp(id, nullptr, attr) == 0) return true;
    provider_missing_ = errno == EOPNOTSUPP || errno == ENOSYS;
    EXPECT_TRUE(provider_missing_) << "rdma_create_qp: errno " << errno;
    return false;
  }
  // Connects `c` to `l` with a SmallRcQpAttr QP at each end, up to
  // ESTABLISHED at both, and returns the Responder's id. nullptr, with `c`
  // and `l` stopped, if the provider makes no QPs (provider_missing_) or a
  // step failed (reported).
  rdma_cm_id* ConnectWithQps(Listener& l, Client& c) {
    l.Start();
    c.Resolve(l.port);
    rdma_cm_id* responder = nullptr;
    ibv_qp_init_attr attr = SmallRcQpAttr();
    if (CreateQp(c.id, &attr)) {
      EXPECT_EQ(c.Connect(), 0);
      const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
      ibv_qp_init_attr sattr = SmallRcQpAttr();
      if (req.id != nullptr && CreateQp(req.id, &sattr)) {
        EXPECT_EQ(rdma_accept(req.id, nullptr), 0);
        Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
        Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
        responder = req.id;
      }
    }
    if (responder == nullptr) {
      c.Stop();
      l.Stop();
    }
    return responder;
  }
  // Disconnects what ConnectWithQps connected and destroys its QPs and ids.
  void DisconnectAndDestroy(Listener& l, Client& c, rdma_cm_id* responder) {
    EXPECT_EQ(rdma_disconnect(c.id), 0);
    Expect(c.channel, RDMA_CM_EVENT_DISCONNECTED);
    Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
    rdma_destroy_qp(responder);
    rdma_destroy_qp(c.id);
    EXPECT_EQ(rdma_destroy_id(responder), 0);
    c.Stop();
    l.Stop();
  }
  bool Listed(ibv_context* c) const {
    return std::find(devices_.begin(), devices_.end(), c) != devices_.end();
  }

  std::vector<ibv_context*> devices_;
  bool provider_missing_ = false;
};

// A TCP relay in front of a listener that makes both connections advertise
// an Ethernet-sized MSS (TCP_MAXSEG before listen and before connect), so
// that the EMSS of the two CM sockets is what a 1500-byte MTU gives although
// the traffic stays on loopback, and that keeps every octet the Initiator
// sends. Read its results after Stop().
class MssRelay {
 public:
  MssRelay(std::uint16_t target_port, int mss) : target_port_(target_port), mss_(mss) {
    listener_ = Fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    setsockopt(listener_.get(), IPPROTO_TCP, TCP_MAXSEG, &mss_, sizeof(mss_));
    sockaddr_in a = Loopback4(0);
    EXPECT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listener_.get(), 1), 0);
    socklen_t len = sizeof(a);
    getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~MssRelay() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    listener_.Reset();
  }

  std::uint16_t port = 0;
  Bytes from_initiator;  // everything the Initiator sent
  int initiator_side_emss = 0;  // TCP_MAXSEG of the relay's accepted socket

 private:
  void Run() {
    pollfd lp{listener_.get(), POLLIN, 0};
    while (!stop_ && poll(&lp, 1, 20) == 0) {
    }
    if (stop_) return;
    Fd in(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!in.valid()) return;
    socklen_t len = sizeof(initiator_side_emss);
    getsockopt(in.get(), IPPROTO_TCP, TCP_MAXSEG, &initiator_side_emss, &len);
    Fd out(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    setsockopt(out.get(), IPPROTO_TCP, TCP_MAXSEG, &mss_, sizeof(mss_));
    sockaddr_in t = Loopback4(target_port_);
    if (connect(out.get(), reinterpret_cast<sockaddr*>(&t), sizeof(t)) != 0) return;
    pollfd p[2] = {{in.get(), POLLIN, 0}, {out.get(), POLLIN, 0}};
    std::vector<std::uint8_t> buf(1 << 16);
    while (!stop_) {
      if (poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = read(p[i].fd, buf.data(), buf.size());
        if (n <= 0) return;  // either side gone: both close with the Fds
        if (i == 0) from_initiator.insert(from_initiator.end(), buf.begin(), buf.begin() + n);
        for (ssize_t done = 0; done < n;) {
          const ssize_t w = write(p[1 - i].fd, buf.data() + done, static_cast<std::size_t>(n - done));
          if (w <= 0) return;
          done += w;
        }
      }
    }
  }

  std::uint16_t target_port_;
  int mss_;
  Fd listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The ULPDU_Length of every FPDU after the startup frames in `wire` (no
// markers; the CRC field is always there, RFC 5044 4.1).
std::vector<std::size_t> UlpduLengths(const Bytes& wire) {
  std::vector<std::size_t> out;
  if (wire.size() < 20) return out;
  std::size_t at = 20 + ((std::size_t{wire[18]} << 8) | wire[19]);  // the Request, PD_Length
  while (at + 2 <= wire.size()) {
    const std::size_t len = (std::size_t{wire[at]} << 8) | wire[at + 1];
    out.push_back(len);
    at += mpa::UnmarkedFpduLength(len);
  }
  return out;
}

TEST_F(CmDevice, LoopbackBindNamesNoDeviceAsInTheKernelCm) {
  // The kernel CM treats a loopback address like the wildcard when binding
  // (cma_any_addr): no device until a connection resolves or arrives.
  // libfabric's verbs provider depends on it (it binds "localhost" and then
  // offers its non-loopback interfaces' addresses).
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* a = nullptr;
  rdma_cm_id* b = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &a, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_create_id(ch, &b, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr = Loopback4();
  ASSERT_EQ(rdma_bind_addr(a, reinterpret_cast<sockaddr*>(&addr)), 0);
  EXPECT_EQ(a->verbs, nullptr);
  EXPECT_EQ(a->pd, nullptr);
  EXPECT_EQ(a->port_num, 0);
  // The socket is bound to the address all the same.
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(&a->route.addr.src_addr)->sin_addr.s_addr,
            htonl(INADDR_LOOPBACK));
  // 127.0.0.2 is loopback too.
  addr.sin_addr.s_addr = htonl(0x7F000002);
  ASSERT_EQ(rdma_bind_addr(b, reinterpret_cast<sockaddr*>(&addr)), 0);
  EXPECT_EQ(b->verbs, nullptr);
  EXPECT_EQ(rdma_destroy_id(a), 0);
  EXPECT_EQ(rdma_destroy_id(b), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmDevice, AnAddressNoDeviceServesIsEnodev) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr = Loopback4();
  addr.sin_addr.s_addr = inet_addr("192.0.2.199");  // TEST-NET-1, on no interface
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmDevice, ResolvedAndRequestIdsCarryTheContext) {
  Listener l;
  l.Start();  // bound to 127.0.0.1
  EXPECT_EQ(l.id->verbs, nullptr);  // loopback bind: no device yet
  Client c;
  c.Resolve(l.port);
  ASSERT_NE(c.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(c.id->verbs->device), "siwx_lo");
  EXPECT_TRUE(Listed(c.id->verbs));
  ASSERT_NE(c.id->pd, nullptr);
  EXPECT_EQ(c.id->pd->context, c.id->verbs);
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  // The shared context and PD of the device the connection arrived on.
  EXPECT_EQ(req.id->verbs, c.id->verbs);
  EXPECT_EQ(req.id->pd, c.id->pd);
  EXPECT_EQ(rdma_reject(req.id, nullptr, 0), 0);
  Expect(c.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmDevice, WildcardListenerFindsTheDeviceOfTheReachedAddress) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_listen(listen, 4), 0);  // 0.0.0.0
  EXPECT_EQ(listen->verbs, nullptr);
  Client c;
  c.Resolve(SrcPort(listen));
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy req = Expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  ASSERT_NE(req.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(req.id->verbs->device), "siwx_lo");
  EXPECT_NE(req.id->pd, nullptr);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  Expect(c.channel, RDMA_CM_EVENT_REJECTED);
  c.Stop();
  EXPECT_EQ(rdma_destroy_id(listen), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmDevice, CreateQpMakesCqsAndMovesToInit) {
  Listener l;
  l.Start();
  Client c;  // a resolved id has the device (a loopback listener has none)
  c.Resolve(l.port);
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 8;
  attr.cap.max_recv_wr = 8;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (!CreateQp(c.id, &attr)) {
    EXPECT_EQ(c.id->qp, nullptr);
    c.Stop();
    l.Stop();
    ExpectNoLeaks();  // a failed rdma_create_qp leaves no CQ or channel behind
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_NE(c.id->qp, nullptr);
  EXPECT_EQ(c.id->qp->pd, c.id->pd);
  EXPECT_NE(c.id->send_cq, nullptr);
  EXPECT_NE(c.id->recv_cq, nullptr);
  EXPECT_NE(c.id->send_cq_channel, nullptr);
  EXPECT_NE(c.id->recv_cq_channel, nullptr);
  EXPECT_EQ(attr.send_cq, c.id->send_cq);  // copied back, as stock does
  EXPECT_EQ(attr.recv_cq, c.id->recv_cq);
  ibv_qp_attr qp_attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(c.id->qp, &qp_attr, IBV_QP_STATE, &init) == 0) {
    EXPECT_EQ(qp_attr.qp_state, IBV_QPS_INIT);
  }
  errno = 0;
  EXPECT_EQ(rdma_create_qp(c.id, nullptr, &attr), -1);  // one QP per id
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_qp(c.id);
  EXPECT_EQ(c.id->qp, nullptr);
  EXPECT_EQ(c.id->send_cq, nullptr);
  EXPECT_EQ(c.id->recv_cq_channel, nullptr);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

// rdma_create_qp_ex hands comp_mask and send_ops_flags to the provider as
// they are: the QP gets the ibv_wr_* API (ibv_qp_to_qp_ex), and an operation
// the provider does not serve fails the create with its EOPNOTSUPP.
TEST_F(CmDevice, CreateQpExCarriesSendOpsFlags) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ibv_qp_init_attr_ex attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;  // the CM adds the PD
  attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  errno = 0;
  EXPECT_EQ(rdma_create_qp_ex(c.id, &attr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(c.id->qp, nullptr);

  attr = ibv_qp_init_attr_ex{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  ASSERT_EQ(rdma_create_qp_ex(c.id, &attr), 0) << "errno " << errno;
  ASSERT_NE(c.id->qp, nullptr);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(c.id->qp);
  ASSERT_NE(qpx, nullptr);
  EXPECT_EQ(&qpx->qp_base, c.id->qp);
  // Not connected yet: an empty region completes, a Send is refused.
  ibv_wr_start(qpx);
  EXPECT_EQ(ibv_wr_complete(qpx), 0);
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
  rdma_destroy_qp(c.id);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmDevice, EstablishedStreamsGoToTheQp) {
  const bool provider_binds = dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream") != nullptr;
  Listener l;
  Client c;
  rdma_cm_id* const responder = ConnectWithQps(l, c);
  if (responder == nullptr) {
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    FAIL() << "no connection with QPs";
  }
  EXPECT_EQ(Info(c.id).stream_bound, provider_binds ? 1u : 0u);
  EXPECT_EQ(Info(responder).stream_bound, provider_binds ? 1u : 0u);
  if (provider_binds) {
    // The stream carries a Send from the Initiator to the Responder (whose
    // first FPDU rule, RFC 5044 7.1.2 rule 4, this satisfies).
    char out[16] = "over the stream";
    char in[16] = {};
    // An int, not the enumerator: the ibv_reg_mr macro masks it with another
    // enum type, which clang warns about.
    const int access = IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* out_mr = ibv_reg_mr(c.id->pd, out, sizeof(out), access);
    ibv_mr* in_mr = ibv_reg_mr(responder->pd, in, sizeof(in), access);
    ASSERT_NE(out_mr, nullptr);
    ASSERT_NE(in_mr, nullptr);
    ibv_sge rsge{reinterpret_cast<std::uintptr_t>(in), sizeof(in), in_mr->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 7;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_r = nullptr;
    ASSERT_EQ(ibv_post_recv(responder->qp, &rwr, &bad_r), 0);
    ibv_sge ssge{reinterpret_cast<std::uintptr_t>(out), sizeof(out), out_mr->lkey};
    ibv_send_wr swr{};
    swr.wr_id = 9;
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_s = nullptr;
    ASSERT_EQ(ibv_post_send(c.id->qp, &swr, &bad_s), 0);
    auto poll_one = [](ibv_cq* cq, ibv_wc* wc) {
      return WaitFor([&] { return ibv_poll_cq(cq, 1, wc) == 1; }, 3000ms);
    };
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(c.id->send_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 9u);
    ASSERT_TRUE(poll_one(responder->recv_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 7u);
    EXPECT_EQ(wc.byte_len, sizeof(out));
    EXPECT_STREQ(in, "over the stream");
    ibv_dereg_mr(out_mr);
    ibv_dereg_mr(in_mr);
  }
  DisconnectAndDestroy(l, c, responder);
  ExpectNoLeaks();
}

// Name and SigBlk of each thread of this process whose name starts "siwx-".
std::vector<std::pair<std::string, std::uint64_t>> SiwxThreadSignalMasks() {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream status(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    std::string name;
    while (std::getline(status, line)) {
      if (line.rfind("Name:\t", 0) == 0) name = line.substr(6);
      if (line.rfind("SigBlk:", 0) == 0 && name.rfind("siwx-", 0) == 0) {
        out.emplace_back(name, std::stoull(line.substr(7), nullptr, 16));
      }
    }
  }
  closedir(d);
  return out;
}

// A process-directed signal (perftest's alarm() for -D, a shell's SIGINT)
// must run the application's handler on one of its own threads: on a siwx
// thread it could interrupt siwx inside the allocator or a lock, and a
// handler that allocates (perftest's reads /proc through stdio) deadlocks.
// Faults stay unblocked, so that they reach their handlers where they occur.
TEST_F(CmDevice, SiwxThreadsLeaveTheApplicationsSignalsToItsThreads) {
  Listener l;
  Client c;
  rdma_cm_id* const responder = ConnectWithQps(l, c);
  if (responder == nullptr) {
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    FAIL() << "no connection with QPs";
  }

  const auto masks = SiwxThreadSignalMasks();
  auto named = [&](const char* name) {
    return std::any_of(masks.begin(), masks.end(), [&](const auto& m) { return m.first == name; });
  };
  EXPECT_TRUE(named("siwx-cm")) << ThreadNames();
  EXPECT_TRUE(named("siwx-progress")) << ThreadNames();
  auto has = [](std::uint64_t set, int signal) { return ((set >> (signal - 1)) & 1) != 0; };
  for (const auto& [name, blocked] : masks) {
    for (int s : {SIGALRM, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD, SIGPIPE}) {
      EXPECT_TRUE(has(blocked, s)) << name << " takes signal " << s;
    }
    for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
      EXPECT_FALSE(has(blocked, s)) << name << " blocks fault signal " << s;
    }
  }

  DisconnectAndDestroy(l, c, responder);
  ExpectNoLeaks();
}

// A connected pair whose Responder QP has one Send of the Initiator in its
// receive CQ, not yet polled, and whose Initiator destroyed its QP and id
// right after its Send completed (a reset, as ofi_rxm closing a connection).
// The Responder's first poll found the CQ empty, before the Send was posted.
class CmDevicePeerGone : public CmDevice {
 protected:
  // Skips or fails the test when no bound pair can be made.
  void Connect() {
    if (dlsym(RTLD_DEFAULT, "siwx_qp_unpolled_completions") == nullptr) {
      GTEST_SKIP() << "the provider does not count unpolled completions (CM-only mode)";
    }
    l_.Start();
    c_.Resolve(l_.port);
    ibv_qp_init_attr attr = SmallRcQpAttr();
    if (!CreateQp(c_.id, &attr)) {
      if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
      return;
    }
    EXPECT_EQ(c_.Connect(), 0);
    server_ = Expect(l_.channel, RDMA_CM_EVENT_CONNECT_REQUEST).id;
    if (server_ == nullptr) return;
    ibv_qp_init_attr sattr = SmallRcQpAttr();
    if (!CreateQp(server_, &sattr)) return;
    EXPECT_EQ(rdma_accept(server_, nullptr), 0);
    Expect(l_.channel, RDMA_CM_EVENT_ESTABLISHED);
    Expect(c_.channel, RDMA_CM_EVENT_ESTABLISHED);
  }

  // Posts the receive, polls it empty, sends, and lets the Initiator go.
  void SendAndVanish() {
    const int access = IBV_ACCESS_LOCAL_WRITE;
    out_mr_ = ibv_reg_mr(c_.id->pd, out_, sizeof(out_), access);
    in_mr_ = ibv_reg_mr(server_->pd, in_, sizeof(in_), access);
    ASSERT_NE(out_mr_, nullptr);
    ASSERT_NE(in_mr_, nullptr);
    ibv_sge rsge{reinterpret_cast<std::uintptr_t>(in_), sizeof(in_), in_mr_->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 7;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_r = nullptr;
    ASSERT_EQ(ibv_post_recv(server_->qp, &rwr, &bad_r), 0);
    ibv_wc wc{};
    ASSERT_EQ(ibv_poll_cq(server_->recv_cq, 1, &wc), 0);
    ibv_sge ssge{reinterpret_cast<std::uintptr_t>(out_), sizeof(out_), out_mr_->lkey};
    ibv_send_wr swr{};
    swr.wr_id = 9;
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_s = nullptr;
    ASSERT_EQ(ibv_post_send(c_.id->qp, &swr, &bad_s), 0);
    ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(c_.id->send_cq, 1, &wc) == 1; }, 3000ms));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    vanished_at_ = std::chrono::steady_clock::now();
    rdma_destroy_qp(c_.id);
    c_.Stop();  // rdma_destroy_id of a connected id: a reset
  }

  // The received Send, polled now.
  void ExpectReceived() {
    ibv_wc wc{};
    ASSERT_EQ(ibv_poll_cq(server_->recv_cq, 1, &wc), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 7u);
    EXPECT_EQ(wc.byte_len, sizeof(out_));
    EXPECT_STREQ(in_, "the last word");
  }

  void TearDown() override {
    if (server_ != nullptr) {
      rdma_destroy_qp(server_);
      EXPECT_EQ(rdma_destroy_id(server_), 0);
    }
    if (out_mr_ != nullptr) ibv_dereg_mr(out_mr_);
    if (in_mr_ != nullptr) ibv_dereg_mr(in_mr_);
    c_.Stop();
    l_.Stop();
    if (!IsSkipped()) ExpectNoLeaks();
  }

  bool EventReady() {
    pollfd p{l_.channel->fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }

  Listener l_;
  Client c_;
  rdma_cm_id* server_ = nullptr;
  char out_[14] = "the last word";
  char in_[14] = {};
  ibv_mr* out_mr_ = nullptr;
  ibv_mr* in_mr_ = nullptr;
  std::chrono::steady_clock::time_point vanished_at_;
};

// ofi_rxm polls its CQ empty and then reads the event channel; on
// DISCONNECTED it destroys the QP, and with it whatever the CQ still holds.
// So the peer's last message must be polled before DISCONNECTED is readable
// (the fi_pingpong -e rdm hang: the peer's "fin" message was lost that way).
TEST_F(CmDevicePeerGone, DisconnectedWaitsUntilTheReceiveIsPolled) {
  Connect();
  if (IsSkipped() || HasFailure()) return;
  SendAndVanish();
  // Time for the Send, the reset and the stream's end to reach the CM.
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(EventReady()) << "DISCONNECTED readable while a received Send is unpolled";
  ExpectReceived();
  const EventCopy e = Expect(l_.channel, RDMA_CM_EVENT_DISCONNECTED, 3000ms);
  EXPECT_EQ(e.id, server_);
}

// An application that never polls still gets DISCONNECTED, after the hold,
// and the completion is still there to poll.
TEST_F(CmDevicePeerGone, DisconnectedComesAfterTheHoldWithoutPolling) {
  Connect();
  if (IsSkipped() || HasFailure()) return;
  SendAndVanish();
  const EventCopy e = Expect(l_.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
  EXPECT_EQ(e.id, server_);
  EXPECT_GE(std::chrono::steady_clock::now() - vanished_at_, Core::kDisconnectHold);
  ExpectReceived();
}

// SIWX_MPA_LARGE_FPDUS end to end: what the two startup frames agreed
// decides the FPDUs the QP sends. Through a relay advertising MSS 1400,
// a 64 KiB Send goes out in FPDUs of MULPDU(EMSS) octets (RFC 5044 4.5) by
// default and unless both ends opted in to L, and then in FPDUs of the
// 16-bit maximum.
TEST_F(CmDevice, LargeFpdusOnlyWhereBothEndsAgreed) {
  if (dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream") == nullptr) {
    GTEST_SKIP() << "the provider does not take streams (CM-only mode)";
  }
  constexpr int kDefault = -1;  // the option left as SIWX_MPA_LARGE_FPDUS has it (unset: 0)
  struct Case {
    int initiator, responder;
    bool agreed;
  };
  for (const Case& k : {Case{kDefault, kDefault, false}, Case{1, 1, true}, Case{0, 1, false},
                        Case{1, 0, false}, Case{1, kDefault, false}}) {
    SCOPED_TRACE("initiator " + std::to_string(k.initiator) + ", responder " +
                 std::to_string(k.responder));
    Listener l;
    l.Start(8, [&](rdma_cm_id* id) {
      if (k.responder == kDefault) return;
      SetOptions(id, [&](siwx_cm_mpa_options& o) {
        o.large_fpdus = static_cast<std::uint32_t>(k.responder);
      });
    });
    MssRelay relay(l.port, 1400);
    Client c;
    c.Resolve(relay.port, [&](rdma_cm_id* id) {
      if (k.initiator == kDefault) return;
      SetOptions(id, [&](siwx_cm_mpa_options& o) {
        o.large_fpdus = static_cast<std::uint32_t>(k.initiator);
      });
    });
    ibv_qp_init_attr attr = SmallRcQpAttr();
    if (!CreateQp(c.id, &attr)) {
      if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
      return;
    }
    ASSERT_EQ(c.Connect(), 0);
    const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req.id, nullptr);
    // A fresh attr: rdma_create_qp wrote the client's CQs into `attr`.
    ibv_qp_init_attr sattr = SmallRcQpAttr();
    ASSERT_TRUE(CreateQp(req.id, &sattr));
    ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
    Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
    Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(Info(c.id).large_fpdus, k.agreed ? 1u : 0u);
    EXPECT_EQ(Info(req.id).large_fpdus, k.agreed ? 1u : 0u);

    constexpr std::size_t kMessage = 65536;
    std::vector<char> out(kMessage, 'x');
    std::vector<char> in(kMessage);
    const int access = IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* out_mr = ibv_reg_mr(c.id->pd, out.data(), out.size(), access);
    ibv_mr* in_mr = ibv_reg_mr(req.id->pd, in.data(), in.size(), access);
    ASSERT_NE(out_mr, nullptr);
    ASSERT_NE(in_mr, nullptr);
    ibv_sge rsge{reinterpret_cast<std::uintptr_t>(in.data()), kMessage, in_mr->lkey};
    ibv_recv_wr rwr{};
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_r = nullptr;
    ASSERT_EQ(ibv_post_recv(req.id->qp, &rwr, &bad_r), 0);
    ibv_sge ssge{reinterpret_cast<std::uintptr_t>(out.data()), kMessage, out_mr->lkey};
    ibv_send_wr swr{};
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_s = nullptr;
    ASSERT_EQ(ibv_post_send(c.id->qp, &swr, &bad_s), 0);
    ibv_wc wc{};
    ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(req.id->recv_cq, 1, &wc) == 1; }, 5000ms));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, kMessage);
    ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(c.id->send_cq, 1, &wc) == 1; }, 5000ms));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);

    ASSERT_EQ(rdma_disconnect(c.id), 0);
    Expect(c.channel, RDMA_CM_EVENT_DISCONNECTED);
    Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
    relay.Stop();
    ibv_dereg_mr(out_mr);
    ibv_dereg_mr(in_mr);
    rdma_destroy_qp(req.id);
    rdma_destroy_qp(c.id);
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
    c.Stop();
    l.Stop();

    // A Send's untagged DDP header is 18 octets (RFC 5041 4.3); the first
    // FPDU is a full one.
    ASSERT_GT(relay.initiator_side_emss, 0);
    ASSERT_LE(relay.initiator_side_emss, 1400);
    engine::StreamParams agreed;
    agreed.large_fpdus = true;
    const std::size_t max_ulpdu =
        k.agreed ? engine::EffectiveMaxUlpdu(agreed, 0)
                 : mpa::Mulpdu(static_cast<std::size_t>(relay.initiator_side_emss), false);
    const std::size_t per_fpdu = max_ulpdu - 18;
    const std::vector<std::size_t> lengths = UlpduLengths(relay.from_initiator);
    ASSERT_EQ(lengths.size(), (kMessage + per_fpdu - 1) / per_fpdu);
    EXPECT_EQ(lengths.front(), max_ulpdu);
    EXPECT_EQ(lengths.back(), 18 + kMessage - per_fpdu * (lengths.size() - 1));
    // 65535 - (6 + 65535 mod 4): the largest ULPDU that keeps the FPDU a
    // multiple of 4 (RFC 5044 4.5 with the 16-bit field as the "EMSS").
    if (k.agreed) {
      EXPECT_EQ(max_ulpdu, 65526u);
    }
  }
  ExpectNoLeaks();
}

// rdma_disconnect, then rdma_destroy_qp at once (the usual teardown): what
// TCP already took must still reach a peer that has not read it yet, then
// FIN; the destroy used to reset the stream (RST), which loses what our
// kernel still held. A raw Initiator (no RTR, no CRC, no markers) with a
// small receive buffer reads a 1 MiB Send only after our QP is gone.
TEST_F(CmDevice, DestroyRightAfterDisconnectLosesNothingTcpHeld) {
  if (dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream_num") == nullptr) {
    GTEST_SKIP() << "the provider does not take streams (CM-only mode)";
  }
  Listener l;
  l.Start();
  Fd raw = RawConnect(l.port);
  const int rcvbuf = 64 << 10;  // most of the Send stays in our kernel
  ASSERT_EQ(setsockopt(raw.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
  // v2 Request with IRD/ORD words, client-server (no A: no RTR), IRD/ORD 1.
  WriteAll(raw, Frame(RequestKey(), 0x1002, 4, IrdOrd(0x0001, 0x0001)));
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  ibv_qp_init_attr attr = SmallRcQpAttr();
  if (!CreateQp(req.id, &attr)) {
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  ASSERT_EQ(ReadN(raw, 24).size(), 24u);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);

  constexpr std::size_t kSize = 1 << 20;
  std::vector<std::uint8_t> out(kSize, 0x5A);
  const int access = IBV_ACCESS_LOCAL_WRITE;  // an int: ibv_reg_mr's macro ORs it
  ibv_mr* out_mr = ibv_reg_mr(req.id->pd, out.data(), out.size(), access);
  ASSERT_NE(out_mr, nullptr);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(out.data()), kSize, out_mr->lkey};
  ibv_send_wr swr{};
  swr.wr_id = 3;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(req.id->qp, &swr, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(req.id->send_cq, 1, &wc) == 1; }, 10000ms))
      << "our kernel did not take the whole Send while the peer was not reading";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_disconnect(req.id), 0);
  rdma_destroy_qp(req.id);

  // Now the peer reads: whole FPDUs carrying all of the Send, then FIN.
  Bytes wire;
  int end = -1;
  for (;;) {
    pollfd p{raw.get(), POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) break;
    std::uint8_t buf[16384];
    const ssize_t got = recv(raw.get(), buf, sizeof(buf), 0);
    if (got <= 0) {
      end = got == 0 ? 0 : errno;
      break;
    }
    wire.insert(wire.end(), buf, buf + got);
  }
  EXPECT_EQ(end, 0) << "not an orderly end (ECONNRESET is " << ECONNRESET << ")";
  std::size_t at = 0;
  std::size_t payload = 0;
  constexpr std::size_t kUntaggedHeader = 18;  // RFC 5041 4.3 + RFC 5040 4.3 (Send)
  while (at + 2 <= wire.size()) {
    const std::size_t ulpdu = (std::size_t{wire[at]} << 8) | wire[at + 1];
    const std::size_t fpdu = ((2 + ulpdu + 3) & ~std::size_t{3}) + 4;  // RFC 5044 4.1
    if (at + fpdu > wire.size() || ulpdu < kUntaggedHeader) break;
    payload += ulpdu - kUntaggedHeader;
    at += fpdu;
  }
  EXPECT_EQ(at, wire.size()) << "the stream ends inside an FPDU";
  EXPECT_EQ(payload, kSize);

  ibv_dereg_mr(out_mr);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  raw.Reset();
  l.Stop();
  ExpectNoLeaks();
}

// RFC 6581 9.2: "For each initiator-supported RTR indication option, the
// responder SHOULD set the corresponding Control Flag if the responder can
// support that option"; the Initiator chooses one of them (1.1) and sends it
// as its first FPDU. A raw Initiator offers Write and Read; our Reply
// advertises both; the raw peer picks Read (as cxgb4 does by default), and
// our QP must answer it with a zero-length Read Response, not refuse it.
TEST_F(CmDevice, PeerToPeerResponderTakesTheRtrTheInitiatorPicked) {
  if (dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream_num") == nullptr) {
    GTEST_SKIP() << "the provider does not take streams (CM-only mode)";
  }
  Listener l;
  l.Start();
  Fd raw = RawConnect(l.port);
  // v2 Request: A | IRD 1, C (Write) | D (Read) | ORD 1.
  WriteAll(raw, Frame(RequestKey(), 0x1002, 4, IrdOrd(0x8001, 0xC001)));
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  ibv_qp_init_attr attr = SmallRcQpAttr();
  if (!CreateQp(req.id, &attr)) {
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  // The Reply advertises both types: A | IRD 1, C | D | ORD 1.
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x8001, 0xC001)));
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  // The zero-length RDMA Read Request RTR (RFC 5040 4.4, RFC 6581 7.1).
  const Bytes read_rtr = {
      0x00, 0x2E,              // ULPDU_Length 46: 18 untagged header + 28 body
      0x41,                    // DDP: untagged, L = 1, DV = 1
      0x41,                    // RDMAP: RV = 1, opcode 0x1 Read Request
      0x00, 0x00, 0x00, 0x00,  // reserved
      0x00, 0x00, 0x00, 0x01,  // QN 1
      0x00, 0x00, 0x00, 0x01,  // MSN 1
      0x00, 0x00, 0x00, 0x00,  // MO 0
      0x00, 0x00, 0x12, 0x34,  // Data Sink STag
      0, 0, 0, 0, 0, 0, 0, 0,  // Data Sink Tagged Offset
      0x00, 0x00, 0x00, 0x00,  // RDMA Read Message Size 0
      0x00, 0x00, 0x00, 0x00,  // Data Source STag
      0, 0, 0, 0, 0, 0, 0, 0,  // Data Source Tagged Offset
      0x00, 0x00, 0x00, 0x00,  // CRC field: CRC not negotiated
  };
  WriteAll(raw, read_rtr);
  const Bytes answer = ReadN(raw, 20);
  ASSERT_EQ(answer.size(), 20u) << "no answer to the Read RTR";
  EXPECT_EQ(answer[0], 0x00);
  EXPECT_EQ(answer[1], 0x0E) << "not a zero-length Read Response (0x16 is a Terminate)";
  EXPECT_EQ(answer[2], 0xC1);  // DDP: tagged, L = 1, DV = 1
  EXPECT_EQ(answer[3], 0x42);  // RDMAP: RV = 1, opcode 0x2 Read Response
  EXPECT_EQ(Bytes(answer.begin() + 4, answer.begin() + 8), (Bytes{0x00, 0x00, 0x12, 0x34}));
  EXPECT_EQ(Info(req.id).rtr_mask, SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ);
  raw.Reset();
  Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
  rdma_destroy_qp(req.id);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  l.Stop();
  ExpectNoLeaks();
}

// RFC 6581 7.1 and RFC 5044 7.1.2 rules 4 and 10: a peer-to-peer responder
// sends nothing until the initiator's RTR, and waits for it at most the MPA
// timeout. An initiator that completes the MPA exchange and then goes
// silent: the responder had ESTABLISHED (the exchange completed, as
// rdma_cm reports it), so what ends its connection is DISCONNECTED, with
// -ECONNRESET; its WRs are flushed; the initiator gets an RST and not one
// FPDU (a Terminate would be one, which rule 4 forbids before the RTR).
TEST_F(CmDevice, SilentPeerToPeerInitiatorIsDisconnectedAfterTheMpaTimeout) {
  if (dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream") == nullptr) {
    GTEST_SKIP() << "the provider does not bind streams (CM-only mode)";
  }
  constexpr std::uint32_t kMpaMs = 300;
  Listener l;
  l.Start(8, [](rdma_cm_id* id) { ShortTimeouts(id, kMpaMs); });
  Fd raw = RawConnect(l.port);
  // v2 with S; IRD word: A (peer-to-peer), IRD 1; ORD word: C (RDMA Write
  // RTR), ORD 1 (RFC 6581 7.1).
  WriteAll(raw, Frame(RequestKey(), 0x1002, 4, IrdOrd(0x8001, 0x8001)));
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  ibv_qp_init_attr attr = SmallRcQpAttr();
  if (!CreateQp(req.id, &attr)) {
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
    l.Stop();
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  ASSERT_EQ(ReadN(raw, 24).size(), 24u);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  const auto established = std::chrono::steady_clock::now();
  EXPECT_EQ(Info(req.id).rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_AWAIT));

  // A Send the responder would speak first with: held back, then flushed.
  char out[8] = "held";
  const int access = IBV_ACCESS_LOCAL_WRITE;
  ibv_mr* out_mr = ibv_reg_mr(req.id->pd, out, sizeof(out), access);
  ASSERT_NE(out_mr, nullptr);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(out), sizeof(out), out_mr->lkey};
  ibv_send_wr swr{};
  swr.wr_id = 5;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(req.id->qp, &swr, &bad), 0);

  const EventCopy e = Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED, 10000ms);
  EXPECT_EQ(e.id, req.id);
  EXPECT_EQ(e.status, -ECONNRESET);
  EXPECT_LT(std::chrono::steady_clock::now() - established, 5000ms)
      << "the MPA timeout is " << kMpaMs << " ms";
  ibv_wc wc{};
  ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(req.id->send_cq, 1, &wc) == 1; }, 3000ms));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  // Nothing after the Reply, then the reset.
  char octet = 0;
  pollfd p{raw.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);
  EXPECT_EQ(recv(raw.get(), &octet, 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);

  ibv_dereg_mr(out_mr);
  rdma_destroy_qp(req.id);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  raw.Reset();
  l.Stop();
  ExpectNoLeaks();
}

// The same wait with a siwx initiator, which sends its RTR at once: the
// connection outlives the MPA timeout, and then the responder may speak
// first.
TEST_F(CmDevice, PeerToPeerConnectionOutlivesTheMpaTimeout) {
  if (dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream") == nullptr) {
    GTEST_SKIP() << "the provider does not bind streams (CM-only mode)";
  }
  constexpr std::uint32_t kMpaMs = 300;
  Listener l;
  l.Start(8, [](rdma_cm_id* id) { ShortTimeouts(id, kMpaMs); });
  Client c;
  c.Resolve(l.port, [](rdma_cm_id* id) {
    ShortTimeouts(id, kMpaMs);
    SetOptions(id, [](siwx_cm_mpa_options& o) { o.peer_to_peer = 1; });
  });
  ibv_qp_init_attr attr = SmallRcQpAttr();
  if (!CreateQp(c.id, &attr)) {
    c.Stop();
    l.Stop();
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ibv_qp_init_attr sattr = SmallRcQpAttr();
  ASSERT_TRUE(CreateQp(req.id, &sattr));
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(req.id).rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_AWAIT));
  // Three MPA timeouts without an event.
  EXPECT_FALSE(NextEvent(l.channel, std::chrono::milliseconds(3 * kMpaMs)).has_value());

  char out[16] = "responder first";
  char in[16] = {};
  const int access = IBV_ACCESS_LOCAL_WRITE;
  ibv_mr* out_mr = ibv_reg_mr(req.id->pd, out, sizeof(out), access);
  ibv_mr* in_mr = ibv_reg_mr(c.id->pd, in, sizeof(in), access);
  ASSERT_NE(out_mr, nullptr);
  ASSERT_NE(in_mr, nullptr);
  ibv_sge rsge{reinterpret_cast<std::uintptr_t>(in), sizeof(in), in_mr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(c.id->qp, &rwr, &bad_r), 0);
  ibv_sge ssge{reinterpret_cast<std::uintptr_t>(out), sizeof(out), out_mr->lkey};
  ibv_send_wr swr{};
  swr.wr_id = 9;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(req.id->qp, &swr, &bad_s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(req.id->send_cq, 1, &wc) == 1; }, 3000ms));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(WaitFor([&] { return ibv_poll_cq(c.id->recv_cq, 1, &wc) == 1; }, 3000ms));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(in, "responder first");
  ibv_dereg_mr(out_mr);
  ibv_dereg_mr(in_mr);

  ASSERT_EQ(rdma_disconnect(c.id), 0);
  Expect(c.channel, RDMA_CM_EVENT_DISCONNECTED);
  Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
  rdma_destroy_qp(req.id);
  rdma_destroy_qp(c.id);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
