// What needs a siwx device context: ids carrying the shared per-device
// ibv_context and PD (the same pointers rdma_get_devices returns), QPs made
// by rdma_create_qp, and the handover of established streams. ctest runs
// these under siwx-run (test cm_with_devices); without devices they skip.
#include <dlfcn.h>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

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
  bool Listed(ibv_context* c) const {
    return std::find(devices_.begin(), devices_.end(), c) != devices_.end();
  }

  std::vector<ibv_context*> devices_;
  bool provider_missing_ = false;
};

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

TEST_F(CmDevice, EstablishedStreamsGoToTheQp) {
  const bool provider_binds = dlsym(RTLD_DEFAULT, "siwx_qp_bind_stream") != nullptr;
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (!CreateQp(c.id, &attr)) {
    c.Stop();
    l.Stop();
    if (provider_missing_) GTEST_SKIP() << "the provider does not create CQs/QPs yet";
    return;
  }
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  ibv_qp_init_attr sattr{};
  sattr.qp_type = IBV_QPT_RC;
  sattr.cap.max_send_wr = sattr.cap.max_recv_wr = 4;
  sattr.cap.max_send_sge = sattr.cap.max_recv_sge = 1;
  ASSERT_TRUE(CreateQp(req.id, &sattr));
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(c.id).stream_bound, provider_binds ? 1u : 0u);
  EXPECT_EQ(Info(req.id).stream_bound, provider_binds ? 1u : 0u);
  if (provider_binds) {
    // The stream carries a Send from the Initiator to the Responder (whose
    // first FPDU rule, RFC 5044 7.1.2 rule 4, this satisfies).
    char out[16] = "over the stream";
    char in[16] = {};
    // An int, not the enumerator: the ibv_reg_mr macro masks it with another
    // enum type, which clang warns about.
    const int access = IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* out_mr = ibv_reg_mr(c.id->pd, out, sizeof(out), access);
    ibv_mr* in_mr = ibv_reg_mr(req.id->pd, in, sizeof(in), access);
    ASSERT_NE(out_mr, nullptr);
    ASSERT_NE(in_mr, nullptr);
    ibv_sge rsge{reinterpret_cast<std::uintptr_t>(in), sizeof(in), in_mr->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 7;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_r = nullptr;
    ASSERT_EQ(ibv_post_recv(req.id->qp, &rwr, &bad_r), 0);
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
    ASSERT_TRUE(poll_one(req.id->recv_cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 7u);
    EXPECT_EQ(wc.byte_len, sizeof(out));
    EXPECT_STREQ(in, "over the stream");
    ibv_dereg_mr(out_mr);
    ibv_dereg_mr(in_mr);
  }
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
