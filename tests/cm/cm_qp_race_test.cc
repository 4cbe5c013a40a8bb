// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The CM against an application that destroys its own QPs with
// ibv_destroy_qp while the CM binds a stream to them or ends their stream on
// another thread (issue 9 item 10). The CM reaches the provider by context
// and QP number only (siwx_qp_bind_stream_num, siwx_qp_disconnect_stream_num,
// siwx_qp_unpolled_completions), never through an ibv_qp pointer that may be
// freed. Run under siwx-run (ctest cm_with_devices), and under TSan/ASan:
// a race shows there as a report, here as an occasional crash.

#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

class CmDeviceQpRace : public LeakCheck {
 protected:
  void SetUp() override {
    if (auto why = MissingSiwxDevice(/*needs_stream_binding=*/true)) GTEST_SKIP() << *why;
    LeakCheck::SetUp();
  }

  // A QP the application owns (created with ibv_create_qp, not
  // rdma_create_qp) on the id's device, in INIT.
  struct OwnQp {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
  };
  static OwnQp MakeOwnQp(rdma_cm_id* id) {
    OwnQp q;
    q.cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
    EXPECT_NE(q.cq, nullptr);
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.send_cq = attr.recv_cq = q.cq;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    q.qp = ibv_create_qp(id->pd, &attr);
    EXPECT_NE(q.qp, nullptr) << "errno " << errno;
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    int mask = 0;
    EXPECT_EQ(rdma_init_qp_attr(id, &init, &mask), 0);
    EXPECT_EQ(ibv_modify_qp(q.qp, &init, mask), 0);
    return q;
  }

  // Takes every event of `channel` within `quiet` of the previous one.
  static std::vector<EventCopy> Drain(rdma_event_channel* channel,
                                      std::chrono::milliseconds quiet = 100ms) {
    std::vector<EventCopy> events;
    while (std::optional<EventCopy> e = NextEvent(channel, quiet)) events.push_back(*e);
    return events;
  }
};

// rdma_accept binds the stream to the QP named by qp_num (in the accepting
// thread, or later on the CM thread); the application destroys that QP at
// the same moment. The accept either binds or fails cleanly; no freed QP is
// touched.
TEST_F(CmDeviceQpRace, DestroyQpWhileAcceptBindsIt) {
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Listener l;
    l.Start();
    Client c;
    c.Resolve(l.port);
    ASSERT_EQ(c.Connect(), 0);
    const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req.id, nullptr);
    OwnQp own = MakeOwnQp(req.id);
    ASSERT_NE(own.qp, nullptr);
    rdma_conn_param p{};
    p.qp_num = own.qp->qp_num;
    p.responder_resources = p.initiator_depth = 1;
    std::thread destroyer([&] { EXPECT_EQ(ibv_destroy_qp(own.qp), 0); });
    const int rc = rdma_accept(req.id, &p);
    destroyer.join();
    // EINVAL: the QP was gone before rdma_accept looked it up.
    EXPECT_TRUE(rc == 0 || errno == EINVAL) << "errno " << errno;
    Drain(l.channel);
    Drain(c.channel);
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
    EXPECT_EQ(ibv_destroy_cq(own.cq), 0);
    c.Stop();
    l.Stop();
  }
  ExpectNoLeaks();
}

// An established pair whose passive QP the application owns: one thread
// destroys it with ibv_destroy_qp while another ends the connection
// (rdma_disconnect, then rdma_destroy_id), and the peer's disconnect reaches
// the CM thread at the same time.
TEST_F(CmDeviceQpRace, DestroyQpWhileTheCmDisconnects) {
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Listener l;
    l.Start();
    Client c;
    c.Resolve(l.port);
    ASSERT_EQ(c.Connect(), 0);
    const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req.id, nullptr);
    OwnQp own = MakeOwnQp(req.id);
    ASSERT_NE(own.qp, nullptr);
    rdma_conn_param p{};
    p.qp_num = own.qp->qp_num;
    p.responder_resources = p.initiator_depth = 1;
    ASSERT_EQ(rdma_accept(req.id, &p), 0);
    Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
    Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_EQ(Info(req.id).stream_bound, 1u);
    std::thread destroyer([&] { EXPECT_EQ(ibv_destroy_qp(own.qp), 0); });
    if (round % 2 == 0) (void)rdma_disconnect(c.id);  // the peer's end, on the CM thread
    EXPECT_EQ(rdma_disconnect(req.id), 0);
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
    destroyer.join();
    Drain(l.channel);
    Drain(c.channel);
    EXPECT_EQ(ibv_destroy_cq(own.cq), 0);
    c.Stop();
    l.Stop();
  }
  ExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
