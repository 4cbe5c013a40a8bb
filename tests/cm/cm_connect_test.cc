// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Connections between two siwx CMs over loopback: connect/accept/reject with
// private data, disconnect, listeners that go away, backlog, synchronous
// endpoints, and the MPA dialect matrix (RFC 5044, the Rtr/S-bit proposal,
// RFC 6581) with CRC, markers and peer-to-peer RTR.
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

class CmConnect : public LeakCheck {};

constexpr int kEconnrefused = -ECONNREFUSED;

// Both sides up to ESTABLISHED; returns the server's id.
rdma_cm_id* Establish(Listener& l, Client& c, const Bytes& client_pd = {},
                      const Bytes& server_pd = {}) {
  EXPECT_EQ(c.Connect(client_pd), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  if (req.id == nullptr) return nullptr;
  rdma_conn_param p{};
  p.private_data = server_pd.empty() ? nullptr : server_pd.data();
  p.private_data_len = static_cast<std::uint8_t>(server_pd.size());
  p.responder_resources = 1;
  p.initiator_depth = 1;
  EXPECT_EQ(rdma_accept(req.id, &p), 0);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  return req.id;
}

TEST_F(CmConnect, PrivateDataBothWaysAndIrdOrdExchange) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  const Bytes hello = Ascii("hello-client");
  ASSERT_EQ(c.Connect(hello, /*responder_resources=*/3, /*initiator_depth=*/2), 0);

  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.status, 0);
  EXPECT_EQ(req.listen_id, l.id);
  ASSERT_NE(req.id, nullptr);
  EXPECT_NE(req.id, l.id);
  EXPECT_EQ(req.private_data, hello);
  // Ready for rdma_accept: our IRD up to the peer's ORD (2), our ORD up to
  // its IRD (3) (RFC 6581 9.1).
  EXPECT_EQ(req.responder_resources, 2);
  EXPECT_EQ(req.initiator_depth, 3);
  EXPECT_EQ(req.id->channel, l.channel);
  EXPECT_EQ(ntohs(rdma_get_dst_port(req.id)), SrcPort(c.id));
  EXPECT_EQ(SrcPort(req.id), l.port);

  const Bytes welcome = Ascii("hello-server");
  rdma_conn_param p{};
  p.private_data = welcome.data();
  p.private_data_len = static_cast<std::uint8_t>(welcome.size());
  p.responder_resources = 2;
  p.initiator_depth = 3;
  ASSERT_EQ(rdma_accept(req.id, &p), 0);
  const EventCopy s_est = Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(s_est.id, req.id);
  EXPECT_EQ(s_est.private_data, Bytes{});
  EXPECT_EQ(s_est.responder_resources, 2);
  EXPECT_EQ(s_est.initiator_depth, 3);
  const EventCopy c_est = Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(c_est.id, c.id);
  EXPECT_EQ(c_est.private_data, welcome);
  // Initiator: IRD = Responder ORD (3), ORD = min(2, Responder IRD 2).
  EXPECT_EQ(c_est.responder_resources, 3);
  EXPECT_EQ(c_est.initiator_depth, 2);

  const siwx_cm_conn_info ci = Info(c.id);
  EXPECT_EQ(ci.role, static_cast<std::uint32_t>(SIWX_CM_ROLE_INITIATOR));
  EXPECT_EQ(ci.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V2));
  EXPECT_EQ(ci.mpa_revision, 2u);
  EXPECT_EQ(ci.crc, 0u);
  EXPECT_EQ(ci.tx_markers, 0u);
  EXPECT_EQ(ci.rx_markers, 0u);
  EXPECT_EQ(ci.ird, 3u);
  EXPECT_EQ(ci.ord, 2u);
  EXPECT_EQ(ci.ird_ord_exchanged, 1u);
  EXPECT_EQ(ci.peer_ird_ord_valid, 1u);
  EXPECT_EQ(ci.peer_ird, 2u);
  EXPECT_EQ(ci.peer_ord, 3u);
  EXPECT_EQ(ci.peer_to_peer, 0u);
  EXPECT_EQ(ci.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_NONE));
  EXPECT_EQ(ci.stream_bound, 0u);  // no QP: CM-only
  EXPECT_EQ(ci.peer_private_data_len, welcome.size());
  EXPECT_EQ(ci.mpa_error, 0u);
  EXPECT_EQ(ci.status, 0);
  EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_NONE));
  EXPECT_STREQ(ci.failure, "");
  const siwx_cm_conn_info si = Info(req.id);
  EXPECT_EQ(si.role, static_cast<std::uint32_t>(SIWX_CM_ROLE_RESPONDER));
  EXPECT_EQ(si.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V2));
  EXPECT_EQ(si.ird, 2u);
  EXPECT_EQ(si.ord, 3u);
  EXPECT_EQ(si.peer_ird, 3u);
  EXPECT_EQ(si.peer_ord, 2u);
  EXPECT_EQ(si.peer_private_data_len, hello.size());

  ASSERT_EQ(rdma_disconnect(c.id), 0);
  EXPECT_EQ(Expect(c.channel, RDMA_CM_EVENT_DISCONNECTED).status, 0);
  EXPECT_EQ(Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED).id, req.id);
  EXPECT_EQ(rdma_disconnect(c.id), 0);  // again: nothing more happens
  EXPECT_EQ(rdma_notify(req.id, IBV_EVENT_COMM_EST), -1);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, RejectCarriesPrivateData) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ASSERT_EQ(c.Connect(Ascii("may I")), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  // libfabric's RxM rejects with a 2-octet {version, reason}.
  const Bytes why = {0x02, 0x72};
  ASSERT_EQ(rdma_reject(req.id, why.data(), static_cast<std::uint8_t>(why.size())), 0);
  const EventCopy rej = Expect(c.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.status, kEconnrefused);
  EXPECT_EQ(rej.private_data, why);
  const siwx_cm_conn_info ci = Info(c.id);
  EXPECT_EQ(ci.dialect, 0u);  // not established
  EXPECT_EQ(ci.status, kEconnrefused);
  EXPECT_EQ(ci.peer_ird_ord_valid, 1u);
  EXPECT_EQ(ci.peer_ird, 0u);  // a reject offers no resources
  EXPECT_EQ(ci.peer_ord, 0u);
  EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_REJECTED));
  errno = 0;
  EXPECT_EQ(rdma_accept(req.id, nullptr), -1);  // already rejected
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ServerDisconnectAndDestroyWithoutDisconnect) {
  Listener l;
  l.Start();
  Client a;
  a.Resolve(l.port);
  rdma_cm_id* sa = Establish(l, a);
  ASSERT_NE(sa, nullptr);
  ASSERT_EQ(rdma_disconnect(sa), 0);
  Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED);
  Expect(a.channel, RDMA_CM_EVENT_DISCONNECTED);
  // Destroying a connected id is a disconnect for the peer.
  Client b;
  b.Resolve(l.port);
  rdma_cm_id* sb = Establish(l, b);
  ASSERT_NE(sb, nullptr);
  EXPECT_EQ(rdma_destroy_id(sb), 0);
  Expect(b.channel, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(rdma_destroy_id(sa), 0);
  a.Stop();
  b.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ConnectToAClosedPortIsRejected) {
  std::uint16_t port = 0;
  { Fd probe = RawListen(&port); }  // a port nobody listens on now
  Client c;
  c.Resolve(port);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy e = Expect(c.channel, RDMA_CM_EVENT_REJECTED, 2000ms);
  EXPECT_EQ(e.status, kEconnrefused);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2000ms);
  EXPECT_EQ(Info(c.id).failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_TCP_CONNECT));
  EXPECT_STREQ(Info(c.id).failure, "TCP connect failed: Connection refused");
  c.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ConnectTimeoutIsUnreachable) {
  // A listener whose accept queue is full drops further SYNs: the connect
  // hangs until our bound.
  std::uint16_t port = 0;
  Fd full = RawListen(&port, 0);
  std::vector<Fd> fillers;
  for (int i = 0; i < 4; ++i) {
    Fd f(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in a = Loopback4(port);
    connect(f.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
    fillers.push_back(std::move(f));
  }
  std::this_thread::sleep_for(50ms);
  Client c;
  c.Resolve(port, [](rdma_cm_id* id) { ShortTimeouts(id, 300, 400); });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(c.Connect(), 0);
  const EventCopy e = Expect(c.channel, RDMA_CM_EVENT_UNREACHABLE, 3000ms);
  EXPECT_EQ(e.status, -ETIMEDOUT);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 350ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2000ms);
  c.Stop();
  fillers.clear();
  full.Reset();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ListenerDestroyedWithARequestQueued) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ASSERT_EQ(c.Connect(), 0);
  // Wait until the request is queued, but do not retrieve it.
  pollfd p{l.channel->fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);
  EXPECT_EQ(rdma_destroy_id(l.id), 0);
  l.id = nullptr;
  const EventCopy e = Expect(c.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(e.status, -ECONNRESET);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ListenerGoneBeforeTheConnect) {
  Listener l;
  l.Start();
  const std::uint16_t port = l.port;
  l.Stop();
  Client c;
  c.Resolve(port);
  ASSERT_EQ(c.Connect(), 0);
  EXPECT_EQ(Expect(c.channel, RDMA_CM_EVENT_REJECTED).status, kEconnrefused);
  c.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, RequestDestroyedUnansweredAndPeerGoneBeforeAccept) {
  Listener l;
  l.Start();
  Client a;
  a.Resolve(l.port);
  ASSERT_EQ(a.Connect(), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);  // never answered
  EXPECT_EQ(Expect(a.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNRESET);
  // The listener keeps serving; a peer that leaves before rdma_accept makes
  // the accept fail.
  Client b;
  b.Resolve(l.port);
  ASSERT_EQ(b.Connect(), 0);
  const EventCopy req_b = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  b.Stop();
  EXPECT_TRUE(WaitFor([&] { return Info(req_b.id).failure_code != SIWX_CM_FAILURE_NONE; },
                      3000ms));
  EXPECT_EQ(Info(req_b.id).failure_code,
            static_cast<std::uint32_t>(SIWX_CM_FAILURE_CONNECTION_CLOSED));
  errno = 0;
  EXPECT_EQ(rdma_accept(req_b.id, nullptr), -1);
  EXPECT_EQ(errno, ECONNRESET);
  EXPECT_EQ(rdma_reject(req_b.id, nullptr, 0), 0);  // nothing left to reject
  EXPECT_EQ(rdma_destroy_id(req_b.id), 0);
  a.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, APortAConnectionLeftFromCanBeListenedOnOnceItIsClosed) {
  // Linux siw sets SO_REUSEADDR on each socket it connects (siw_cm.c,
  // kernel_bindconnect: "make address available again asap"), so the
  // TIME_WAIT of a closed connection never keeps a later listener from the
  // port the connection left from. Without it, any fixed-port server could
  // fail to start for a minute after an unrelated connection closed.
  Listener l;
  l.Start();
  Client a;
  a.Resolve(l.port);
  rdma_cm_id* sa = Establish(l, a);
  ASSERT_NE(sa, nullptr);
  const std::uint16_t left_from = ntohs(rdma_get_src_port(a.id));
  ASSERT_EQ(rdma_disconnect(a.id), 0);  // the client closes first: its side waits in TIME_WAIT
  Expect(l.channel, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(rdma_destroy_id(sa), 0);
  a.Stop();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(l.channel, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr = Loopback4(left_from);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)), 0) << std::strerror(errno);
  EXPECT_EQ(rdma_listen(id, 4), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, APortIsFreeAgainWhenItsListenerIsGone) {
  // perftest -R: the control listener goes, its connection stays, and the
  // data listener binds the same port (the kernel CM allows it: connections
  // do not hold the rdma_cm port).
  Listener l;
  l.Start();
  const std::uint16_t port = l.port;
  Client a;
  a.Resolve(port);
  rdma_cm_id* sa = Establish(l, a);
  ASSERT_NE(sa, nullptr);
  EXPECT_EQ(rdma_destroy_id(l.id), 0);
  l.id = nullptr;
  rdma_cm_id* again = nullptr;
  ASSERT_EQ(rdma_create_id(l.channel, &again, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr = Loopback4(port);
  ASSERT_EQ(rdma_bind_addr(again, reinterpret_cast<sockaddr*>(&addr)), 0);
  ASSERT_EQ(rdma_listen(again, 4), 0);
  // While it listens, the port is taken, also through the wildcard.
  rdma_cm_id* third = nullptr;
  ASSERT_EQ(rdma_create_id(l.channel, &third, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in any = Loopback4(port);
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(third, reinterpret_cast<sockaddr*>(&any)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  Client b;
  b.Resolve(port);
  ASSERT_EQ(b.Connect(), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.listen_id, again);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  Expect(b.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rdma_destroy_id(third), 0);
  EXPECT_EQ(rdma_destroy_id(again), 0);
  EXPECT_EQ(rdma_destroy_id(sa), 0);
  a.Stop();
  b.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, MigratedListenerTakesItsQueuedRequestsAlong) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ASSERT_EQ(c.Connect(Ascii("m")), 0);
  pollfd p{l.channel->fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);  // queued, not retrieved
  rdma_event_channel* eq = rdma_create_event_channel();
  ASSERT_NE(eq, nullptr);
  ASSERT_EQ(rdma_migrate_id(l.id, eq), 0);
  EXPECT_EQ(poll(&p, 1, 0), 0);  // the old channel is empty now
  const EventCopy req = Expect(eq, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.listen_id, l.id);
  EXPECT_EQ(req.private_data, Ascii("m"));
  EXPECT_EQ(req.id->channel, eq);
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  EXPECT_EQ(Expect(eq, RDMA_CM_EVENT_ESTABLISHED).id, req.id);
  Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  rdma_destroy_event_channel(eq);
  ExpectNoLeaks();
}

TEST_F(CmConnect, BacklogLimitsPendingRequests) {
  Listener l;
  l.Start(/*backlog=*/1);
  Client a;
  a.Resolve(l.port);
  Client b;
  b.Resolve(l.port);
  ASSERT_EQ(a.Connect(Ascii("a")), 0);
  const EventCopy req_a = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req_a.private_data, Ascii("a"));
  ASSERT_EQ(b.Connect(Ascii("b")), 0);
  // One request awaits the application: the second stays in the kernel.
  EXPECT_FALSE(NextEvent(l.channel, 300ms).has_value());
  ASSERT_EQ(rdma_accept(req_a.id, nullptr), 0);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  Expect(a.channel, RDMA_CM_EVENT_ESTABLISHED);
  const EventCopy req_b = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req_b.private_data, Ascii("b"));
  ASSERT_EQ(rdma_reject(req_b.id, nullptr, 0), 0);
  const EventCopy rej = Expect(b.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.private_data, Bytes{});
  EXPECT_EQ(rdma_destroy_id(req_a.id), 0);
  EXPECT_EQ(rdma_destroy_id(req_b.id), 0);
  a.Stop();
  b.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, Ipv6Loopback) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in6 a6 = Loopback6();
  if (rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&a6)) != 0) {
    rdma_destroy_id(listen);
    rdma_destroy_event_channel(ch);
    GTEST_SKIP() << "no IPv6 loopback";
  }
  ASSERT_EQ(rdma_listen(listen, 4), 0);
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &client, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in6 dst = Loopback6(SrcPort(listen));
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  Expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(client->route.addr.src_sin6.sin6_family, AF_INET6);
  ASSERT_EQ(rdma_resolve_route(client, 100), 0);
  Expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(client, &p), 0);
  const EventCopy req = Expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.id->route.addr.dst_sin6.sin6_family, AF_INET6);
  ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
  // Both ESTABLISHED events come on the one channel, in either order.
  std::optional<EventCopy> e1 = NextEvent(ch);
  std::optional<EventCopy> e2 = NextEvent(ch);
  ASSERT_TRUE(e1 && e2);
  EXPECT_EQ(e1->type, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(e2->type, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_NE(e1->id, e2->id);
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmConnect, SynchronousEndpoints) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  rdma_addrinfo* passive = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "0", &hints, &passive), 0);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, passive, nullptr, nullptr), 0);
  rdma_freeaddrinfo(passive);
  ASSERT_EQ(rdma_listen(listen, 2), 0);
  const std::string port = std::to_string(SrcPort(listen));

  std::thread server([&] {
    rdma_cm_id* conn = nullptr;
    ASSERT_EQ(rdma_get_request(listen, &conn), 0);
    ASSERT_NE(conn, nullptr);
    ASSERT_NE(conn->event, nullptr);
    EXPECT_EQ(conn->event->event, RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(conn->event->listen_id, listen);
    ASSERT_EQ(conn->event->param.conn.private_data_len, 3);
    EXPECT_EQ(std::memcmp(conn->event->param.conn.private_data, "syn", 3), 0);
    rdma_conn_param p{};
    p.private_data = "ack";
    p.private_data_len = 3;
    EXPECT_EQ(rdma_accept(conn, &p), 0);  // returns once ESTABLISHED
    ASSERT_NE(conn->event, nullptr);
    EXPECT_EQ(conn->event->event, RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(rdma_disconnect(conn), 0);  // returns with its DISCONNECTED, as librdmacm
    ASSERT_NE(conn->event, nullptr);
    EXPECT_EQ(conn->event->event, RDMA_CM_EVENT_DISCONNECTED);
    rdma_destroy_ep(conn);
  });

  hints = {};
  hints.ai_flags = RAI_NUMERICHOST;
  rdma_addrinfo* active = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", port.c_str(), &hints, &active), 0);
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_ep(&client, active, nullptr, nullptr), 0);
  rdma_freeaddrinfo(active);
  rdma_conn_param p{};
  p.private_data = "syn";
  p.private_data_len = 3;
  ASSERT_EQ(rdma_connect(client, &p), 0);  // returns once ESTABLISHED
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(client->event->param.conn.private_data_len, 3);
  EXPECT_EQ(std::memcmp(client->event->param.conn.private_data, "ack", 3), 0);
  server.join();
  rdma_destroy_ep(client);
  rdma_destroy_ep(listen);
  ExpectNoLeaks();
}

TEST_F(CmConnect, SynchronousConnectReportsTheReject) {
  Listener l;
  l.Start();
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &client, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Loopback4(l.port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  ASSERT_EQ(rdma_resolve_route(client, 100), 0);
  std::thread server([&] {
    const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(rdma_reject(req.id, "no", 2), 0);
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
  });
  rdma_conn_param p{};
  errno = 0;
  EXPECT_EQ(rdma_connect(client, &p), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_REJECTED);
  ASSERT_EQ(client->event->param.conn.private_data_len, 2);
  EXPECT_EQ(std::memcmp(client->event->param.conn.private_data, "no", 2), 0);
  server.join();
  EXPECT_EQ(rdma_destroy_id(client), 0);
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ReadDepthsAreClampedToTheDeviceLimit) {
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  if (c.id->verbs != nullptr) GTEST_SKIP() << "device limits differ from the CM-only ones";
  // 255 is RDMA_MAX_RESP_RES ("the limit"); 200 is above it: both clamp to
  // 128 instead of failing (libfabric passes 255).
  ASSERT_EQ(c.Connect({}, RDMA_MAX_RESP_RES, 200), 0);
  const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.responder_resources, 128);
  EXPECT_EQ(req.initiator_depth, 128);
  const siwx_cm_conn_info si = Info(req.id);
  EXPECT_EQ(si.peer_ird, 128u);
  EXPECT_EQ(si.peer_ord, 128u);
  rdma_conn_param p{};
  p.responder_resources = 250;
  p.initiator_depth = 0;
  ASSERT_EQ(rdma_accept(req.id, &p), 0);
  Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
  const EventCopy est = Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(est.responder_resources, 0);   // = Responder ORD 0
  EXPECT_EQ(est.initiator_depth, 128);     // min(128, Responder IRD 128)
  EXPECT_EQ(rdma_destroy_id(req.id), 0);
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

TEST_F(CmConnect, ManyConnectionsOnOneListener) {
  Listener l;
  // A backlog of 4 would hold the rest in the kernel queue, whose overflow
  // costs a SYN retransmission (1 s): the backlog test covers that.
  l.Start(16);
  constexpr int kClients = 12;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>());
    clients.back()->Resolve(l.port);
    ASSERT_EQ(clients.back()->Connect({static_cast<std::uint8_t>(i)}), 0);
  }
  std::vector<rdma_cm_id*> accepted;
  int established = 0;
  while (established < kClients) {
    const std::optional<EventCopy> e = NextEvent(l.channel);
    ASSERT_TRUE(e.has_value());
    if (e->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      ASSERT_EQ(e->private_data.size(), 1u);
      ASSERT_EQ(rdma_accept(e->id, nullptr), 0);
      accepted.push_back(e->id);
    } else {
      ASSERT_EQ(e->type, RDMA_CM_EVENT_ESTABLISHED);
      ++established;
    }
  }
  for (auto& c : clients) Expect(c->channel, RDMA_CM_EVENT_ESTABLISHED);
  for (rdma_cm_id* id : accepted) EXPECT_EQ(rdma_destroy_id(id), 0);
  clients.clear();
  l.Stop();
  ExpectNoLeaks();
}

// ---- The dialect matrix ----

struct DialectCase {
  siwx_mpa_dialect initiator;
  siwx_mpa_dialect responder;
  // 0: the connection fails (the responder closes, RFC 6581 10).
  int negotiated;
  std::uint32_t revision;
};

std::string CaseName(const ::testing::TestParamInfo<DialectCase>& info) {
  auto name = [](siwx_mpa_dialect d) {
    return d == SIWX_MPA_DIALECT_V1 ? "V1" : d == SIWX_MPA_DIALECT_V1_RTR ? "V1Rtr" : "V2";
  };
  return std::string("Initiator") + name(info.param.initiator) + "Responder" +
         name(info.param.responder);
}

class DialectMatrix : public LeakCheck, public ::testing::WithParamInterface<DialectCase> {};

TEST_P(DialectMatrix, NegotiatesWhatBothSupport) {
  const DialectCase& dc = GetParam();
  Listener l;
  l.Start(8, [&](rdma_cm_id* id) {
    SetOptions(id, [&](siwx_cm_mpa_options& o) { o.dialect = dc.responder; });
  });
  Client c;
  c.Resolve(l.port, [&](rdma_cm_id* id) {
    SetOptions(id, [&](siwx_cm_mpa_options& o) { o.dialect = dc.initiator; });
  });
  ASSERT_EQ(c.Connect(Ascii("pd")), 0);
  if (dc.negotiated == 0) {
    // A responder without enhanced establishment closes on an enhanced
    // Request; the application never sees it.
    EXPECT_EQ(Expect(c.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNRESET);
    EXPECT_FALSE(NextEvent(l.channel, 100ms).has_value());
    const siwx_cm_conn_info ci = Info(c.id);
    EXPECT_EQ(ci.dialect, 0u);
    EXPECT_EQ(ci.mpa_error, 1u);  // connection lost
    EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_CONNECTION_CLOSED));
  } else {
    const EventCopy req = Expect(l.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(req.private_data, Ascii("pd"));
    ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
    Expect(l.channel, RDMA_CM_EVENT_ESTABLISHED);
    Expect(c.channel, RDMA_CM_EVENT_ESTABLISHED);
    const siwx_cm_conn_info ci = Info(c.id);
    const siwx_cm_conn_info si = Info(req.id);
    EXPECT_EQ(ci.dialect, static_cast<std::uint32_t>(dc.negotiated));
    EXPECT_EQ(si.dialect, static_cast<std::uint32_t>(dc.negotiated));
    EXPECT_EQ(ci.mpa_revision, dc.revision);
    EXPECT_EQ(si.mpa_revision, dc.revision);
    EXPECT_EQ(ci.ird_ord_exchanged, dc.negotiated == SIWX_MPA_DIALECT_V2 ? 1u : 0u);
    // Both ends at the default SIWX_MPA_LARGE_FPDUS=0: standard frames, no
    // L, MULPDU FPDUs in every dialect.
    EXPECT_EQ(ci.large_fpdus, 0u);
    EXPECT_EQ(si.large_fpdus, 0u);
    EXPECT_EQ(rdma_destroy_id(req.id), 0);
  }
  c.Stop();
  l.Stop();
  ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(
    AllPairs, DialectMatrix,
    ::testing::Values(
        DialectCase{SIWX_MPA_DIALECT_V1, SIWX_MPA_DIALECT_V1, SIWX_MPA_DIALECT_V1, 1},
        DialectCase{SIWX_MPA_DIALECT_V1, SIWX_MPA_DIALECT_V1_RTR, SIWX_MPA_DIALECT_V1, 1},
        DialectCase{SIWX_MPA_DIALECT_V1, SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V1, 1},
        // The proposal's fallback: a v1 Responder answers S = 0.
        DialectCase{SIWX_MPA_DIALECT_V1_RTR, SIWX_MPA_DIALECT_V1, SIWX_MPA_DIALECT_V1, 1},
        DialectCase{SIWX_MPA_DIALECT_V1_RTR, SIWX_MPA_DIALECT_V1_RTR, SIWX_MPA_DIALECT_V1_RTR, 1},
        DialectCase{SIWX_MPA_DIALECT_V1_RTR, SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V1_RTR, 1},
        DialectCase{SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V1, 0, 0},
        DialectCase{SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V1_RTR, 0, 0},
        DialectCase{SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V2, SIWX_MPA_DIALECT_V2, 2}),
    CaseName);

// ---- Peer-to-peer RTR, CRC and markers ----

class CmNegotiation : public LeakCheck {
 protected:
  // Connects with the given option changes; returns the server id or
  // nullptr when the client got `failure` instead of ESTABLISHED.
  rdma_cm_id* Run(const std::function<void(siwx_cm_mpa_options&)>& client_options,
                  const std::function<void(siwx_cm_mpa_options&)>& server_options,
                  rdma_cm_event_type failure = RDMA_CM_EVENT_ESTABLISHED, int status = 0,
                  std::uint8_t initiator_depth = 1) {
    listener_.Start(8, [&](rdma_cm_id* id) { SetOptions(id, server_options); });
    client_.Resolve(listener_.port, [&](rdma_cm_id* id) { SetOptions(id, client_options); });
    EXPECT_EQ(client_.Connect({}, 1, initiator_depth), 0);
    if (failure != RDMA_CM_EVENT_ESTABLISHED && failure != RDMA_CM_EVENT_CONNECT_ERROR) {
      // Refused before the application saw the request.
      EXPECT_EQ(Expect(client_.channel, failure).status, status);
      EXPECT_FALSE(NextEvent(listener_.channel, 100ms).has_value());
      return nullptr;
    }
    const EventCopy req = Expect(listener_.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(rdma_accept(req.id, nullptr), 0);
    Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
    if (failure == RDMA_CM_EVENT_CONNECT_ERROR) {
      EXPECT_EQ(Expect(client_.channel, failure).status, status);
      // The Initiator's Terminate and close end the accepted connection.
      Expect(listener_.channel, RDMA_CM_EVENT_DISCONNECTED);
    } else {
      Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
    }
    server_ids_.push_back(req.id);
    return req.id;
  }
  void TearDown() override {
    for (rdma_cm_id* id : server_ids_) EXPECT_EQ(rdma_destroy_id(id), 0);
    client_.Stop();
    listener_.Stop();
    ExpectNoLeaks();
  }

  Listener listener_;
  Client client_;
  std::vector<rdma_cm_id*> server_ids_;
};

TEST_F(CmNegotiation, LargeFpdusOffByDefault) {
  rdma_cm_id* server = Run([](siwx_cm_mpa_options&) {}, [](siwx_cm_mpa_options&) {});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).large_fpdus, 0u);
  EXPECT_EQ(Info(server).large_fpdus, 0u);
}

TEST_F(CmNegotiation, LargeFpdusAgreedWhenBothEndsOptIn) {
  rdma_cm_id* server = Run([](siwx_cm_mpa_options& o) { o.large_fpdus = 1; },
                           [](siwx_cm_mpa_options& o) { o.large_fpdus = 1; });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).large_fpdus, 1u);
  EXPECT_EQ(Info(server).large_fpdus, 1u);
}

TEST_F(CmNegotiation, LargeFpdusOffNotOfferedByTheInitiator) {
  rdma_cm_id* server =
      Run([](siwx_cm_mpa_options& o) { o.large_fpdus = 0; },
          [](siwx_cm_mpa_options& o) { o.large_fpdus = 1; });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).large_fpdus, 0u);
  EXPECT_EQ(Info(server).large_fpdus, 0u);
}

TEST_F(CmNegotiation, LargeFpdusOffNotAcceptedByTheResponder) {
  rdma_cm_id* server =
      Run([](siwx_cm_mpa_options& o) { o.large_fpdus = 1; },
          [](siwx_cm_mpa_options& o) { o.large_fpdus = 0; });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).large_fpdus, 0u);
  EXPECT_EQ(Info(server).large_fpdus, 0u);
}

TEST_F(CmNegotiation, PeerToPeerPrefersWriteRtr) {
  rdma_cm_id* server = Run(
      [](siwx_cm_mpa_options& o) { o.peer_to_peer = 1; }, [](siwx_cm_mpa_options&) {});
  ASSERT_NE(server, nullptr);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.peer_to_peer, 1u);
  EXPECT_EQ(ci.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_SEND));
  EXPECT_EQ(ci.rtr_message, static_cast<std::uint32_t>(SIWX_RTR_MESSAGE_WRITE));
  EXPECT_EQ(ci.rtr_mask, SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ);
  const siwx_cm_conn_info si = Info(server);
  EXPECT_EQ(si.peer_to_peer, 1u);
  EXPECT_EQ(si.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_AWAIT));
  EXPECT_EQ(si.rtr_mask, SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ);
}

TEST_F(CmNegotiation, PeerToPeerSendRtrOnly) {
  rdma_cm_id* server = Run(
      [](siwx_cm_mpa_options& o) {
        o.peer_to_peer = 1;
        o.rtr_mask = SIWX_RTR_MASK_SEND;
      },
      [](siwx_cm_mpa_options&) {});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).rtr_message, static_cast<std::uint32_t>(SIWX_RTR_MESSAGE_SEND));
  EXPECT_EQ(Info(server).rtr_mask, SIWX_RTR_MASK_SEND);
}

TEST_F(CmNegotiation, PeerToPeerWithoutACommonRtrTypeFails) {
  // The Responder advertises what it supports (Write); the Initiator can
  // send only a Read RTR: Terminate code 7 (RFC 6581 9.2).
  Run(
      [](siwx_cm_mpa_options& o) {
        o.peer_to_peer = 1;
        o.rtr_mask = SIWX_RTR_MASK_READ;
      },
      [](siwx_cm_mpa_options& o) { o.rtr_mask = SIWX_RTR_MASK_WRITE; },
      RDMA_CM_EVENT_CONNECT_ERROR, -EPROTO);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.mpa_error, 7u);
  EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_NO_MATCHING_RTR));
}

TEST_F(CmNegotiation, ReadRtrNeedsAnOrdSlot) {
  listener_.Start();
  client_.Resolve(listener_.port, [](rdma_cm_id* id) {
    SetOptions(id, [](siwx_cm_mpa_options& o) {
      o.peer_to_peer = 1;
      o.rtr_mask = SIWX_RTR_MASK_READ;
    });
  });
  errno = 0;
  EXPECT_EQ(client_.Connect({}, 1, /*initiator_depth=*/0), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CmNegotiation, CrcRequiredByEitherEnd) {
  rdma_cm_id* server = Run([](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; },
                           [](siwx_cm_mpa_options&) {});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).crc, 1u);
  EXPECT_EQ(Info(server).crc, 1u);
}

TEST_F(CmNegotiation, CrcRequiredByTheResponder) {
  rdma_cm_id* server = Run([](siwx_cm_mpa_options&) {},
                           [](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Info(client_.id).crc, 1u);
  EXPECT_EQ(Info(server).crc, 1u);
}

TEST_F(CmNegotiation, CrcRefusedByTheInitiator) {
  Run([](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REFUSE; },
      [](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; },
      RDMA_CM_EVENT_CONNECT_ERROR, -EPROTO);
  EXPECT_EQ(Info(client_.id).mpa_error, 4u);
  EXPECT_EQ(Info(client_.id).failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_CRC_REFUSED));
}

TEST_F(CmNegotiation, CrcRefusedByTheResponder) {
  // The Responder's policy rejects before the application sees anything.
  Run([](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; },
      [](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REFUSE; }, RDMA_CM_EVENT_REJECTED,
      -ECONNREFUSED);
}

TEST_F(CmNegotiation, MarkersBothWays) {
  rdma_cm_id* server = Run([](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REQUIRE; },
                           [](siwx_cm_mpa_options&) {});
  ASSERT_NE(server, nullptr);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.rx_markers, 1u);
  EXPECT_EQ(ci.tx_markers, 0u);
  const siwx_cm_conn_info si = Info(server);
  EXPECT_EQ(si.tx_markers, 1u);
  EXPECT_EQ(si.rx_markers, 0u);
}

TEST_F(CmNegotiation, MarkersRefusedByTheResponder) {
  Run([](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REQUIRE; },
      [](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REFUSE; }, RDMA_CM_EVENT_REJECTED,
      -ECONNREFUSED);
}

}  // namespace
}  // namespace siwx::cm::test
