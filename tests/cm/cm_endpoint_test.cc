// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// librdmacm's endpoint API as its own examples (rdma_server, rdma_client,
// rdma_xserver) use it: rdma_getaddrinfo, rdma_create_ep with and without a
// QP and PD, rdma_get_request creating the QP, and the inline helpers of
// rdma_verbs.h on the QPs the CM made. The CmDeviceEndpoint tests need siwx
// devices and run under siwx-run (test cm_with_devices); without devices
// they skip.
#include <rdma/rdma_verbs.h>

#include <cstring>
#include <string>
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

class CmEndpoint : public LeakCheck {};
class CmDeviceEndpoint : public LeakCheck {
 protected:
  void SetUp() override {
    if (const auto why = MissingSiwxDevice(true)) GTEST_SKIP() << *why;
    LeakCheck::SetUp();
  }
};

rdma_addrinfo* GetAddrInfo(const char* node, const char* service, int flags,
                           int port_space = 0, int qp_type = 0) {
  rdma_addrinfo hints{};
  hints.ai_flags = flags;
  hints.ai_port_space = port_space;
  hints.ai_qp_type = qp_type;
  rdma_addrinfo* res = nullptr;
  const int rc = rdma_getaddrinfo(node, service, &hints, &res);
  EXPECT_EQ(rc, 0) << "rdma_getaddrinfo(" << (node ? node : "NULL") << ", " << service
                   << "): " << rc << ", errno " << errno;
  return rc == 0 ? res : nullptr;
}

// What rdma_server and rdma_client pass: the QP type left 0 (rdma_create_ep
// takes it from the rdma_addrinfo), signalled sends, inline data.
ibv_qp_init_attr ExampleQpAttr() {
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 16;
  attr.sq_sig_all = 1;
  return attr;
}

TEST_F(CmEndpoint, PortSpacesWithoutRcQpsAreRefusedAtOnce) {
  // udaddy and mckey (RDMA_PS_UDP, UD), rdma_xserver -c x (RDMA_PS_IB,
  // XRC): EOPNOTSUPP, as kernel siw answers for their QPs, before anything
  // reaches the network.
  struct Case {
    int port_space;
    int qp_type;
  };
  for (const Case c : {Case{RDMA_PS_UDP, 0}, Case{RDMA_PS_IPOIB, IBV_QPT_UD},
                       Case{RDMA_PS_IB, IBV_QPT_XRC_RECV}, Case{RDMA_PS_TCP, IBV_QPT_UC}}) {
    for (const int flags : {RAI_PASSIVE | RAI_NUMERICHOST, RAI_NUMERICHOST}) {
      rdma_addrinfo* res = GetAddrInfo("127.0.0.1", "7471", flags, c.port_space, c.qp_type);
      ASSERT_NE(res, nullptr);
      rdma_cm_id* id = nullptr;
      errno = 0;
      EXPECT_EQ(rdma_create_ep(&id, res, nullptr, nullptr), -1)
          << "port space " << c.port_space << " QP type " << c.qp_type;
      EXPECT_EQ(errno, EOPNOTSUPP);
      EXPECT_EQ(id, nullptr);
      rdma_freeaddrinfo(res);
    }
  }
  ExpectNoLeaks();
}

TEST_F(CmEndpoint, PassiveEndpointWithoutQpAttributesGetsNoQp) {
  rdma_addrinfo* res = GetAddrInfo("127.0.0.1", "0", RAI_PASSIVE | RAI_NUMERICHOST);
  ASSERT_NE(res, nullptr);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, res, nullptr, nullptr), 0);
  rdma_freeaddrinfo(res);
  EXPECT_NE(listen->channel, nullptr);  // a synchronous id has a private channel
  EXPECT_EQ(listen->qp, nullptr);
  EXPECT_NE(SrcPort(listen), 0);
  rdma_destroy_ep(listen);
  ExpectNoLeaks();
}

// rdma_server and rdma_client in one process, with RDMA Write and Read
// added: every call of rdma_verbs.h on QPs that rdma_create_ep and
// rdma_get_request created.
TEST_F(CmDeviceEndpoint, EndpointQpsCarryDataThroughTheRdmaVerbsHelpers) {
  rdma_addrinfo* passive = GetAddrInfo("127.0.0.1", "0", RAI_PASSIVE | RAI_NUMERICHOST);
  ASSERT_NE(passive, nullptr);
  ibv_qp_init_attr attr = ExampleQpAttr();
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, passive, nullptr, &attr), 0);
  rdma_freeaddrinfo(passive);
  EXPECT_EQ(listen->qp, nullptr);  // the QP comes with each request
  ASSERT_EQ(rdma_listen(listen, 0), 0);
  const std::string port = std::to_string(SrcPort(listen));

  // The server's target of the client's Write and source of its Read.
  struct Advert {
    std::uint64_t addr;
    std::uint32_t rkey;
    std::uint32_t pad;
  };
  char window[32] = "server window, read me";
  std::thread server([&] {
    rdma_cm_id* conn = nullptr;
    ASSERT_EQ(rdma_get_request(listen, &conn), 0);
    ASSERT_NE(conn->qp, nullptr);
    EXPECT_EQ(conn->qp->qp_type, IBV_QPT_RC);
    EXPECT_NE(conn->send_cq, nullptr);
    EXPECT_NE(conn->recv_cq, nullptr);
    EXPECT_NE(conn->send_cq_channel, nullptr);
    EXPECT_EQ(conn->pd, conn->qp->pd);
    char recv_msg[16] = {};
    ibv_mr* recv_mr = rdma_reg_msgs(conn, recv_msg, sizeof(recv_msg));
    ASSERT_NE(recv_mr, nullptr);
    ibv_mr* window_mr = ibv_reg_mr(conn->pd, window, sizeof(window),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(window_mr, nullptr);
    Advert advert{reinterpret_cast<std::uintptr_t>(window), window_mr->rkey, 0};
    ibv_mr* advert_mr = rdma_reg_msgs(conn, &advert, sizeof(advert));
    ASSERT_NE(advert_mr, nullptr);
    ASSERT_EQ(rdma_post_recv(conn, nullptr, recv_msg, sizeof(recv_msg), recv_mr), 0);
    ASSERT_EQ(rdma_accept(conn, nullptr), 0);
    ibv_wc wc{};
    ASSERT_EQ(rdma_get_recv_comp(conn, &wc), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, 6u);
    EXPECT_STREQ(recv_msg, "hello");
    ASSERT_EQ(rdma_post_recv(conn, nullptr, recv_msg, sizeof(recv_msg), recv_mr), 0);
    ASSERT_EQ(rdma_post_send(conn, nullptr, &advert, sizeof(advert), advert_mr, 0), 0);
    ASSERT_EQ(rdma_get_send_comp(conn, &wc), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(rdma_get_recv_comp(conn, &wc), 1);  // "done": the Write has landed
    EXPECT_STREQ(recv_msg, "done");
    EXPECT_STREQ(window + 16, "written");
    EXPECT_EQ(rdma_disconnect(conn), 0);
    EXPECT_EQ(rdma_dereg_mr(advert_mr), 0);
    EXPECT_EQ(rdma_dereg_mr(window_mr), 0);
    EXPECT_EQ(rdma_dereg_mr(recv_mr), 0);
    rdma_destroy_ep(conn);
  });

  rdma_addrinfo* active = GetAddrInfo("127.0.0.1", port.c_str(), RAI_NUMERICHOST);
  ASSERT_NE(active, nullptr);
  attr = ExampleQpAttr();
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_ep(&client, active, nullptr, &attr), 0);
  rdma_freeaddrinfo(active);
  ASSERT_NE(client->qp, nullptr);
  EXPECT_EQ(attr.qp_type, IBV_QPT_RC);  // filled in from the rdma_addrinfo, as librdmacm
  EXPECT_EQ(attr.send_cq, client->send_cq);
  EXPECT_EQ(client->pd, client->qp->pd);
  Advert advert{};
  ibv_mr* advert_mr = rdma_reg_msgs(client, &advert, sizeof(advert));
  char source[8] = "unused";
  ibv_mr* source_mr = rdma_reg_read(client, source, sizeof(source));  // the helper exists
  ASSERT_NE(source_mr, nullptr);
  EXPECT_EQ(rdma_dereg_mr(source_mr), 0);
  ASSERT_NE(advert_mr, nullptr);
  char send_msg[16] = "hello";
  ibv_mr* send_mr = rdma_reg_msgs(client, send_msg, sizeof(send_msg));
  ASSERT_NE(send_mr, nullptr);
  // The sink of an RDMA Read is a tagged buffer the peer's Read Response
  // writes (RFC 5040 4.4): on iWARP it is registered for remote write.
  char local[32] = {};
  ibv_mr* read_mr = rdma_reg_write(client, local, sizeof(local));
  ASSERT_NE(read_mr, nullptr);
  ASSERT_EQ(rdma_post_recv(client, nullptr, &advert, sizeof(advert), advert_mr), 0);
  ASSERT_EQ(rdma_connect(client, nullptr), 0);  // synchronous: returns once established
  ASSERT_EQ(rdma_post_send(client, nullptr, send_msg, 6, send_mr, 0), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(client, &wc), 1);
  ASSERT_NE(advert.rkey, 0u);
  // Read the first 16 octets of the window, then Write 8 behind them.
  ASSERT_EQ(rdma_post_read(client, nullptr, local, 16, read_mr, 0, advert.addr, advert.rkey), 0);
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(std::memcmp(local, "server window, r", 16), 0);
  std::memcpy(local + 16, "written", 8);
  ASSERT_EQ(rdma_post_write(client, nullptr, local + 16, 8, read_mr, 0, advert.addr + 16,
                            advert.rkey),
            0);
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  std::memcpy(send_msg, "done", 5);
  ASSERT_EQ(rdma_post_send(client, nullptr, send_msg, 5, send_mr, 0), 0);
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  server.join();
  // The server disconnected: the synchronous id's next wait takes it.
  EXPECT_EQ(rdma_disconnect(client), 0);
  EXPECT_EQ(rdma_dereg_mr(read_mr), 0);
  EXPECT_EQ(rdma_dereg_mr(send_mr), 0);
  EXPECT_EQ(rdma_dereg_mr(advert_mr), 0);
  rdma_destroy_ep(client);
  rdma_destroy_ep(listen);
  ExpectNoLeaks();
}

TEST_F(CmDeviceEndpoint, CreateQpUsesTheIdsSrqAndTheCallersPd) {
  rdma_addrinfo* res = GetAddrInfo("127.0.0.1", "7471", RAI_NUMERICHOST);
  ASSERT_NE(res, nullptr);
  // Resolved to siwx_lo without a QP; then an SRQ, then the QP that takes it.
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_ep(&id, res, nullptr, nullptr), 0);
  ASSERT_NE(id->verbs, nullptr);
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = 4;
  srq_attr.attr.max_sge = 1;
  ASSERT_EQ(rdma_create_srq(id, nullptr, &srq_attr), 0);
  ASSERT_NE(id->srq, nullptr);
  ibv_qp_init_attr attr = ExampleQpAttr();
  attr.qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);
  EXPECT_EQ(id->qp->srq, id->srq);  // as librdmacm: the id's SRQ serves the QP
  rdma_destroy_ep(id);              // QP, CQs, SRQ and id

  // A PD of the caller's: the QP is made in it and the id reports it.
  ASSERT_EQ(rdma_create_ep(&id, res, nullptr, nullptr), 0);
  ibv_pd* pd = ibv_alloc_pd(id->verbs);
  ASSERT_NE(pd, nullptr);
  rdma_destroy_ep(id);
  attr = ExampleQpAttr();
  ASSERT_EQ(rdma_create_ep(&id, res, pd, &attr), 0);
  EXPECT_EQ(id->qp->pd, pd);
  EXPECT_EQ(id->pd, pd);
  rdma_destroy_ep(id);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);

  // Only RC QPs, as kernel siw.
  ASSERT_EQ(rdma_create_ep(&id, res, nullptr, nullptr), 0);
  attr = ExampleQpAttr();
  attr.qp_type = IBV_QPT_UD;
  errno = 0;
  EXPECT_EQ(rdma_create_qp(id, nullptr, &attr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(id->qp, nullptr);
  rdma_destroy_ep(id);
  rdma_freeaddrinfo(res);
  ExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
