// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The rdma_cm API surface that needs no peer: event channels, ids,
// addresses, options, QP attributes, devices, and what is refused.
#include <fcntl.h>
#include <netdb.h>

#include <atomic>
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

class CmApi : public LeakCheck {};

bool HaveDevices() {
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  rdma_free_devices(list);
  return n > 0;
}

TEST_F(CmApi, ChannelFdIsPollableAndHonoursNonBlocking) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  ASSERT_GE(ch->fd, 0);
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
  rdma_cm_event* ev = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(ch, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);

  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, reinterpret_cast<void*>(0x1234), RDMA_PS_TCP), 0);
  EXPECT_EQ(id->channel, ch);
  EXPECT_EQ(id->context, reinterpret_cast<void*>(0x1234));
  EXPECT_EQ(id->ps, RDMA_PS_TCP);
  EXPECT_EQ(id->qp_type, IBV_QPT_RC);
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  EXPECT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_EQ(rdma_get_cm_event(ch, &ev), 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(ev->status, 0);
  EXPECT_EQ(ev->id, id);
  EXPECT_EQ(ev->listen_id, nullptr);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(ch, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, GetCmEventBlocksUntilAnEventArrives) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  std::atomic<bool> returned{false};
  rdma_cm_event* ev = nullptr;
  int rc = -2;
  std::thread waiter([&] {
    rc = rdma_get_cm_event(ch, &ev);
    returned = true;
  });
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(returned.load());
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  waiter.join();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, UnknownObjectsAreEinval) {
  rdma_cm_event fake_event{};
  errno = 0;
  EXPECT_EQ(rdma_ack_cm_event(&fake_event), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_id fake_id{};
  errno = 0;
  EXPECT_EQ(rdma_destroy_id(&fake_id), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_event_channel fake_channel{-1};
  rdma_cm_event* ev = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(&fake_channel, &ev), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_event_channel(&fake_channel);  // ignored
  errno = 0;
  EXPECT_EQ(rdma_create_id(&fake_channel, nullptr, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_id* id = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_create_id(&fake_channel, &id, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(id, nullptr);
  EXPECT_EQ(rdma_get_src_port(nullptr), 0);
  EXPECT_EQ(rdma_get_dst_port(nullptr), 0);
  ExpectNoLeaks();
}

TEST_F(CmApi, EventNames) {
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_RESOLVED), "RDMA_CM_EVENT_ADDR_RESOLVED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_ERROR), "RDMA_CM_EVENT_ADDR_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ROUTE_RESOLVED), "RDMA_CM_EVENT_ROUTE_RESOLVED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ROUTE_ERROR), "RDMA_CM_EVENT_ROUTE_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST), "RDMA_CM_EVENT_CONNECT_REQUEST");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_RESPONSE), "RDMA_CM_EVENT_CONNECT_RESPONSE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_ERROR), "RDMA_CM_EVENT_CONNECT_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_UNREACHABLE), "RDMA_CM_EVENT_UNREACHABLE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_DISCONNECTED), "RDMA_CM_EVENT_DISCONNECTED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_DEVICE_REMOVAL), "RDMA_CM_EVENT_DEVICE_REMOVAL");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_MULTICAST_JOIN), "RDMA_CM_EVENT_MULTICAST_JOIN");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_MULTICAST_ERROR), "RDMA_CM_EVENT_MULTICAST_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_CHANGE), "RDMA_CM_EVENT_ADDR_CHANGE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(99)), "UNKNOWN EVENT");
}

TEST_F(CmApi, OnlyTheTcpPortSpaceExists) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  // EOPNOTSUPP: what kernel siw answers for the UD (or XRC) QP such an id
  // would need; refused when the id is made, so no peer waits for it.
  for (rdma_port_space ps : {RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB}) {
    errno = 0;
    EXPECT_EQ(rdma_create_id(ch, &id, nullptr, ps), -1);
    EXPECT_EQ(errno, EOPNOTSUPP);
  }
  errno = 0;
  EXPECT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP), -1);  // synchronous too
  EXPECT_EQ(errno, EOPNOTSUPP);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, BindGivesAnEphemeralPortAndRefusesItTwice) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* a = nullptr;
  rdma_cm_id* b = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &a, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_create_id(ch, &b, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr = Loopback4();
  ASSERT_EQ(rdma_bind_addr(a, reinterpret_cast<sockaddr*>(&addr)), 0);
  const std::uint16_t port = SrcPort(a);
  EXPECT_NE(port, 0);
  EXPECT_EQ(a->route.addr.src_sin.sin_family, AF_INET);
  EXPECT_EQ(a->route.addr.src_sin.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(rdma_get_dst_port(a), 0);
  if (!HaveDevices()) {
    EXPECT_EQ(a->verbs, nullptr);  // CM-only mode
  }
  // A second bind of the id, and the same port for another id, fail.
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(a, reinterpret_cast<sockaddr*>(&addr)), -1);
  EXPECT_EQ(errno, EINVAL);
  addr.sin_port = htons(port);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(b, reinterpret_cast<sockaddr*>(&addr)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  EXPECT_EQ(rdma_destroy_id(a), 0);
  EXPECT_EQ(rdma_destroy_id(b), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, BindIpv6AndRefuseOtherFamilies) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_storage ib{};
  ib.ss_family = 27;  // AF_IB
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&ib)), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in6 a6 = Loopback6();
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a6)) == 0) {
    EXPECT_EQ(id->route.addr.src_sin6.sin6_family, AF_INET6);
    EXPECT_NE(SrcPort(id), 0);
  } else {
    EXPECT_EQ(errno, EADDRNOTAVAIL) << "IPv6 loopback missing";
  }
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, ListenOnAnUnboundIdBindsTheIpv4Wildcard) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_listen(id, 0), 0);
  EXPECT_EQ(id->route.addr.src_sin.sin_family, AF_INET);
  EXPECT_EQ(id->route.addr.src_sin.sin_addr.s_addr, htonl(INADDR_ANY));
  EXPECT_NE(SrcPort(id), 0);
  EXPECT_EQ(id->verbs, nullptr);  // a wildcard bind names no device
  errno = 0;
  EXPECT_EQ(rdma_listen(id, 4), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, CallsOutOfOrderAreEinval) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  rdma_conn_param p{};
  auto expect_einval = [](int rc) {
    EXPECT_EQ(rc, -1);
    EXPECT_EQ(errno, EINVAL);
    errno = 0;
  };
  expect_einval(rdma_resolve_route(id, 100));
  expect_einval(rdma_connect(id, &p));
  expect_einval(rdma_accept(id, &p));
  expect_einval(rdma_reject(id, nullptr, 0));
  expect_einval(rdma_disconnect(id));
  expect_einval(rdma_establish(id));
  expect_einval(rdma_notify(id, IBV_EVENT_COMM_EST));
  rdma_cm_id* req = nullptr;
  expect_einval(rdma_get_request(id, &req));  // not a synchronous id
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  Expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  expect_einval(rdma_connect(id, &p));  // the route comes first
  expect_einval(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100));
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, ResolveFillsBothAddressesAndBindsTheSource) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Loopback4(4791);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  Expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(id->route.addr.dst_sin.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(ntohs(rdma_get_dst_port(id)), 4791);
  EXPECT_EQ(id->route.addr.src_sin.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_NE(SrcPort(id), 0);
  ASSERT_EQ(rdma_resolve_route(id, 100), 0);
  const EventCopy e = Expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  EXPECT_EQ(e.status, 0);
  EXPECT_EQ(id->route.num_paths, 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, SynchronousIdsBlockAndKeepTheirLastEvent) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_NE(id->channel, nullptr);  // its private channel
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(id, 100), 0);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  EXPECT_EQ(rdma_destroy_id(id), 0);  // acks the last event
  ExpectNoLeaks();
}

TEST_F(CmApi, MigrateMovesQueuedEvents) {
  rdma_event_channel* from = rdma_create_event_channel();
  rdma_event_channel* to = rdma_create_event_channel();
  ASSERT_NE(from, nullptr);
  ASSERT_NE(to, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(from, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), 0);
  ASSERT_EQ(rdma_migrate_id(id, to), 0);
  EXPECT_EQ(id->channel, to);
  const EventCopy e = Expect(to, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(e.id, id);
  // `from` has nothing left and is no longer readable.
  ASSERT_EQ(fcntl(from->fd, F_SETFL, O_NONBLOCK), 0);
  rdma_cm_event* ev = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(from, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  // To a synchronous channel and back; a synchronous id is one already
  // (EINVAL, as librdmacm).
  ASSERT_EQ(rdma_migrate_id(id, nullptr), 0);
  EXPECT_NE(id->channel, to);
  EXPECT_NE(id->channel, nullptr);
  errno = 0;
  EXPECT_EQ(rdma_migrate_id(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_migrate_id(id, from), 0);
  EXPECT_EQ(id->channel, from);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(from);
  rdma_destroy_event_channel(to);
  ExpectNoLeaks();
}

TEST_F(CmApi, OptionsAcceptedAndRefused) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  std::uint8_t tos = 0x10;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)), 0);
  int on = 1;
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof(on)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof(on)), 0);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof(on)), 0);
  std::uint8_t timeout = 14;
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, 1), -1);
  EXPECT_EQ(errno, ENOSYS);
  std::uint8_t path[64] = {};
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, path, sizeof(path)), -1);
  EXPECT_EQ(errno, ENOSYS);
  sockaddr_in addr = Loopback4();
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)), 0);
  errno = 0;  // after the bind it would change nothing
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof(on)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, InitQpAttrIsWhatTheKernelIwCmAnswers) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_INIT;
  ASSERT_EQ(rdma_init_qp_attr(id, &attr, &mask), 0);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT);
  EXPECT_EQ(attr.qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(attr.port_num, 1);
  for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
    attr = {};
    attr.qp_state = s;
    ASSERT_EQ(rdma_init_qp_attr(id, &attr, &mask), 0);
    EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_PORT);
    EXPECT_EQ(attr.port_num, 1);
  }
  attr.qp_state = IBV_QPS_ERR;
  errno = 0;
  EXPECT_EQ(rdma_init_qp_attr(id, &attr, &mask), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, GetAddrInfoPassiveAndActive) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->ai_flags, RAI_PASSIVE);
  EXPECT_EQ(res->ai_family, AF_INET);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  ASSERT_EQ(res->ai_src_len, sizeof(sockaddr_in));
  const auto* src = reinterpret_cast<const sockaddr_in*>(res->ai_src_addr);
  EXPECT_EQ(src->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(ntohs(src->sin_port), 7471);
  EXPECT_EQ(res->ai_dst_addr, nullptr);
  EXPECT_EQ(res->ai_next, nullptr);
  rdma_freeaddrinfo(res);

  hints = {};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo("::1", "18515", &hints, &res), 0);
  EXPECT_EQ(res->ai_flags, 0);  // as librdmacm: only RAI_PASSIVE is reported
  EXPECT_EQ(res->ai_family, AF_INET6);
  ASSERT_EQ(res->ai_dst_len, sizeof(sockaddr_in6));
  const auto* dst = reinterpret_cast<const sockaddr_in6*>(res->ai_dst_addr);
  EXPECT_EQ(std::memcmp(&dst->sin6_addr, &in6addr_loopback, sizeof(in6_addr)), 0);
  EXPECT_EQ(ntohs(dst->sin6_port), 18515);
  EXPECT_EQ(res->ai_src_addr, nullptr);
  rdma_freeaddrinfo(res);

  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  // As librdmacm 44: a name that does not resolve returns getaddrinfo's
  // code (rdma_server and friends print it with gai_strerror).
  EXPECT_EQ(rdma_getaddrinfo("not-an-address", nullptr, &hints, &res), EAI_NONAME);
  EXPECT_EQ(errno, ENOENT);
  hints.ai_family = 27;  // AF_IB
  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo("::1", "1", &hints, &res), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  // Any port space translates (no device is involved); an id of one that
  // iWARP lacks is refused when it is created.
  hints = {};
  hints.ai_port_space = RDMA_PS_UDP;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "1", &hints, &res), 0);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_UDP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_UD);
  rdma_freeaddrinfo(res);
  rdma_freeaddrinfo(nullptr);
  ExpectNoLeaks();
}

TEST_F(CmApi, DevicesAreTheSharedContexts) {
  int n = -1;
  ibv_context** list = rdma_get_devices(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 0);
  EXPECT_EQ(list[n], nullptr);
  int again_n = -1;
  ibv_context** again = rdma_get_devices(&again_n);
  ASSERT_EQ(again_n, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(again[i], list[i]);  // opened once, shared
  rdma_free_devices(list);
  rdma_free_devices(again);
}

TEST_F(CmApi, MulticastAndEceAreRefused) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in group = Loopback4();
  group.sin_addr.s_addr = htonl(0xef010101);  // 239.1.1.1
  // The kernel CM's answers on an iWARP device: ENOSYS for a valid join,
  // EINVAL before that; librdmacm's EADDRNOTAVAIL for a group never joined.
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&group), nullptr), -1);
  EXPECT_EQ(errno, ENOSYS);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  rdma_cm_join_mc_attr_ex mc{};
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id, &mc, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);  // no address
  mc.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  mc.addr = reinterpret_cast<sockaddr*>(&group);
  mc.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id, &mc, nullptr), -1);
  EXPECT_EQ(errno, ENOSYS);
  mc.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id, &mc, nullptr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  int not_an_id = 0;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(reinterpret_cast<rdma_cm_id*>(&not_an_id),
                                reinterpret_cast<sockaddr*>(&group), nullptr),
            -1);
  EXPECT_EQ(errno, EINVAL);
  ibv_ece ece{};
  errno = 0;
  EXPECT_EQ(rdma_set_local_ece(id, &ece), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(rdma_get_remote_ece(id, &ece), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, QpCreationNeedsADevice) {
  if (HaveDevices()) GTEST_SKIP() << "siwx devices present: covered by the verbs tests";
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  errno = 0;
  EXPECT_EQ(rdma_create_qp(id, nullptr, &attr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(id->qp, nullptr);
  rdma_destroy_qp(id);  // nothing to destroy
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, MpaOptionsRoundTripAndValidation) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  siwx_cm_mpa_options o{};
  o.size = sizeof(o);
  ASSERT_EQ(siwx_cm_get_mpa_options(id, &o), 0);
  EXPECT_EQ(o.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V2));
  EXPECT_EQ(o.crc, static_cast<std::uint32_t>(SIWX_CM_POLICY_ALLOW));
  EXPECT_EQ(o.markers, static_cast<std::uint32_t>(SIWX_CM_POLICY_ALLOW));
  EXPECT_EQ(o.peer_to_peer, 0u);
  EXPECT_EQ(o.rtr_mask, SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ);
  EXPECT_EQ(o.connect_timeout_ms, 10000u);
  EXPECT_EQ(o.mpa_timeout_ms, 10000u);
  EXPECT_EQ(o.large_fpdus, 0u);  // SIWX_MPA_LARGE_FPDUS unset: standard frames
  siwx_cm_mpa_options set = o;
  set.large_fpdus = 1;
  set.dialect = SIWX_MPA_DIALECT_V1_RTR;
  set.crc = SIWX_CM_POLICY_REQUIRE;
  set.rtr_mask = SIWX_RTR_MASK_READ;
  set.mpa_timeout_ms = 1234;
  ASSERT_EQ(siwx_cm_set_mpa_options(id, &set), 0);
  siwx_cm_mpa_options back{};
  back.size = sizeof(back);
  ASSERT_EQ(siwx_cm_get_mpa_options(id, &back), 0);
  EXPECT_EQ(back.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1_RTR));
  EXPECT_EQ(back.crc, static_cast<std::uint32_t>(SIWX_CM_POLICY_REQUIRE));
  EXPECT_EQ(back.rtr_mask, SIWX_RTR_MASK_READ);
  EXPECT_EQ(back.mpa_timeout_ms, 1234u);
  EXPECT_EQ(back.large_fpdus, 1u);
  auto refused = [&](const std::function<void(siwx_cm_mpa_options&)>& change) {
    siwx_cm_mpa_options bad = o;
    change(bad);
    errno = 0;
    EXPECT_EQ(siwx_cm_set_mpa_options(id, &bad), -1);
    EXPECT_EQ(errno, EINVAL);
  };
  refused([](siwx_cm_mpa_options& b) { b.dialect = 0; });
  refused([](siwx_cm_mpa_options& b) { b.dialect = 4; });
  refused([](siwx_cm_mpa_options& b) { b.crc = 3; });
  refused([](siwx_cm_mpa_options& b) { b.markers = 7; });
  refused([](siwx_cm_mpa_options& b) { b.rtr_mask = 0; });
  refused([](siwx_cm_mpa_options& b) { b.rtr_mask = 8; });
  refused([](siwx_cm_mpa_options& b) {
    b.peer_to_peer = 1;
    b.dialect = SIWX_MPA_DIALECT_V1;
  });
  refused([](siwx_cm_mpa_options& b) { b.mpa_timeout_ms = 0; });
  refused([](siwx_cm_mpa_options& b) { b.connect_timeout_ms = 600001; });
  refused([](siwx_cm_mpa_options& b) { b.size = 4; });
  refused([](siwx_cm_mpa_options& b) { b.large_fpdus = 2; });
  siwx_cm_conn_info info{};
  info.size = sizeof(info);
  errno = 0;
  EXPECT_EQ(siwx_cm_connection_info(id, &info), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

TEST_F(CmApi, TheCmThreadLivesExactlyAsLongAsIds) {
  const int threads = CountThreads();
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(CountThreads(), threads);  // a channel alone needs no thread
  std::vector<rdma_cm_id*> ids(40);
  for (rdma_cm_id*& id : ids) ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(CountThreads(), threads + 1);
  for (std::size_t i = 0; i < ids.size(); i += 2) {
    sockaddr_in a = Loopback4();
    ASSERT_EQ(rdma_bind_addr(ids[i], reinterpret_cast<sockaddr*>(&a)), 0);
  }
  ASSERT_EQ(rdma_listen(ids[0], 4), 0);
  for (rdma_cm_id* id : ids) ASSERT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(CountThreads(), threads);
  rdma_destroy_event_channel(ch);
  ExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
