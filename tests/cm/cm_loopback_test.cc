// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Loopback addresses as the kernel CM treats them, in the order libfabric's
// verbs provider (1.17, fi_getinfo with no node) uses them: a synchronous
// id binds "localhost" and must get no device (verbs NULL), after which
// libfabric offers the addresses of its non-loopback interfaces; binding an
// interface's own address names that interface's device; resolving a
// loopback destination picks the loopback device. The fixture's name starts
// with CmDevice so that ctest runs it under siwx-run (cm_with_devices).
#include <ifaddrs.h>
#include <net/if.h>

#include "rdmacm-ext/cm_socket.h"
#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

TEST(CmSockAddr, LoopbackIs127Slash8AndColonColon1AndTheirMappedForms) {
  const auto v4 = [](const char* text) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    EXPECT_EQ(inet_pton(AF_INET, text, &a.sin_addr), 1);
    return *net::SockAddr::From(reinterpret_cast<const sockaddr*>(&a));
  };
  const auto v6 = [](const char* text) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    EXPECT_EQ(inet_pton(AF_INET6, text, &a.sin6_addr), 1);
    return *net::SockAddr::From(reinterpret_cast<const sockaddr*>(&a));
  };
  EXPECT_TRUE(v4("127.0.0.1").IsLoopback());
  EXPECT_TRUE(v4("127.255.0.9").IsLoopback());
  EXPECT_FALSE(v4("128.0.0.1").IsLoopback());
  EXPECT_FALSE(v4("0.0.0.0").IsLoopback());
  EXPECT_FALSE(v4("192.0.2.2").IsLoopback());
  EXPECT_TRUE(v6("::1").IsLoopback());
  EXPECT_TRUE(v6("::ffff:127.0.0.1").IsLoopback());
  EXPECT_FALSE(v6("::").IsLoopback());
  EXPECT_FALSE(v6("::2").IsLoopback());
  EXPECT_FALSE(v6("::ffff:192.0.2.2").IsLoopback());
  EXPECT_FALSE(v6("fe80::1").IsLoopback());
}

// The first IPv4 address of an up, non-loopback interface, with its name.
std::optional<std::pair<std::string, std::string>> NonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::pair<std::string, std::string>> out;
  for (const ifaddrs* ifa = list; ifa != nullptr && !out; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0 || (ifa->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr, text,
              sizeof(text));
    out = std::make_pair(std::string(ifa->ifa_name), std::string(text));
  }
  freeifaddrs(list);
  return out;
}

class CmDeviceLoopback : public LeakCheck {
 protected:
  void SetUp() override {
    if (auto why = MissingSiwxDevice()) GTEST_SKIP() << *why;
    LeakCheck::SetUp();
  }

  // rdma_getaddrinfo(node, RAI_PASSIVE | RAI_NUMERICHOST) and rdma_bind_addr
  // on a synchronous id, as vrb_ifa_rdma_info and vrb_get_rai_id do. The
  // id's device name, "" for none; nullopt if a step failed.
  std::optional<std::string> BoundDevice(const char* node, int family) {
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST | RAI_FAMILY;
    hints.ai_family = family;
    hints.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* rai = nullptr;
    if (rdma_getaddrinfo(node, nullptr, &hints, &rai) != 0) {
      ADD_FAILURE() << "rdma_getaddrinfo(" << node << "): errno " << errno;
      return std::nullopt;
    }
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
    std::optional<std::string> out;
    if (id != nullptr && rai->ai_src_addr != nullptr) {
      if (rdma_bind_addr(id, rai->ai_src_addr) == 0) {
        out = id->verbs == nullptr ? std::string() : ibv_get_device_name(id->verbs->device);
        EXPECT_EQ(id->pd == nullptr, id->verbs == nullptr);
      } else {
        ADD_FAILURE() << "rdma_bind_addr(" << node << "): errno " << errno;
      }
    }
    if (id != nullptr) {
      EXPECT_EQ(rdma_destroy_id(id), 0);
    }
    rdma_freeaddrinfo(rai);
    return out;
  }
};

TEST_F(CmDeviceLoopback, BindingLocalhostNamesNoDevice) {
  EXPECT_EQ(BoundDevice("127.0.0.1", AF_INET), std::optional<std::string>(""));
  EXPECT_EQ(BoundDevice("::1", AF_INET6), std::optional<std::string>(""));
  ExpectNoLeaks();
}

TEST_F(CmDeviceLoopback, BindingAnInterfaceAddressNamesItsDevice) {
  const auto iface = NonLoopbackIpv4();
  if (!iface) GTEST_SKIP() << "no non-loopback IPv4 address";
  EXPECT_EQ(BoundDevice(iface->second.c_str(), AF_INET),
            std::optional<std::string>("siwx_" + iface->first));
  ExpectNoLeaks();
}

TEST_F(CmDeviceLoopback, ResolvingLoopbackOnASynchronousIdPicksSiwxLo) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Loopback4(4791);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_NE(id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "siwx_lo");
  // rdma_get_local_addr(): the source the connection will leave from.
  const auto* src = reinterpret_cast<const sockaddr_in*>(rdma_get_local_addr(id));
  EXPECT_EQ(src->sin_family, AF_INET);
  EXPECT_EQ(src->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_NE(src->sin_port, 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  ExpectNoLeaks();
}

TEST_F(CmDeviceLoopback, ALoopbackBoundIdGetsSiwxLoWhenItResolves) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in src = Loopback4();
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&src)), 0);
  EXPECT_EQ(id->verbs, nullptr);
  sockaddr_in dst = Loopback4(4791);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_NE(id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "siwx_lo");
  EXPECT_NE(id->pd, nullptr);
  EXPECT_EQ(id->port_num, 1);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  ExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
