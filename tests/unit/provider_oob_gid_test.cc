// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The GID that names a process's out-of-band listener
// (providers/siwx/identity.h, docs/out-of-band-connect.md), octet by octet.
#include <arpa/inet.h>

#include <gtest/gtest.h>

#include "providers/siwx/identity.h"

namespace siwx::provider {
namespace {

TEST(ProviderOobGidTest, LayoutIsPrefixZeroPortFfffAddress) {
  // 192.0.2.1 port 38847 (0x97bf): ibv_rc_pingpong prints ::97bf:ffff:c000:201.
  const GidBytes gid = OobGid({inet_addr("192.0.2.1"), htons(38847)});
  const GidBytes want = {0, 0, 0, 0, 0, 0, 0, 0, 0x97, 0xbf, 0xff, 0xff, 0xc0, 0x00, 0x02, 0x01};
  EXPECT_EQ(gid, want);
  OobEndpoint back;
  ASSERT_TRUE(OobEndpointOf(gid, &back));
  EXPECT_EQ(back.address, inet_addr("192.0.2.1"));
  EXPECT_EQ(back.port, htons(38847));
}

TEST(ProviderOobGidTest, OtherGidsNameNoEndpoint) {
  OobEndpoint e;
  GidBytes gid = OobGid({inet_addr("127.0.0.1"), htons(1)});
  ASSERT_TRUE(OobEndpointOf(gid, &e));
  GidBytes prefix = gid;
  prefix[0] = 0xfe;  // a subnet prefix: an IPv6 or InfiniBand GID
  EXPECT_FALSE(OobEndpointOf(prefix, &e));
  GidBytes no_marker = gid;
  no_marker[11] = 0xfe;  // the EUI-64 interface id GID siwx reports without IPv4
  EXPECT_FALSE(OobEndpointOf(no_marker, &e));
  EXPECT_FALSE(OobEndpointOf(OobGid({inet_addr("127.0.0.1"), 0}), &e));
  EXPECT_FALSE(OobEndpointOf(OobGid({0, htons(5)}), &e));
  EXPECT_FALSE(OobEndpointOf(PortGid({0x02, 0xfc, 0, 0, 0, 1}, "siwx_eth0"), &e));
}

}  // namespace
}  // namespace siwx::provider
