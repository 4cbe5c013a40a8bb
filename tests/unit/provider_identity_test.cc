// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Device identity (providers/siwx/identity.h): node GUID, interface id (RFC
// 4291 appendix A modified EUI-64), GID layout and IB MTU from the interface.
#include "providers/siwx/identity.h"

#include <gtest/gtest.h>

namespace siwx::provider {
namespace {

constexpr MacAddress kMac = {0x02, 0xFC, 0x00, 0x00, 0x00, 0x01};
constexpr MacAddress kUniversalMac = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55};
constexpr MacAddress kNoMac = {};

TEST(ProviderIdentityTest, NodeGuidIsTheMacThenTwoZeroOctets) {
  // siw's node GUID: MAC in octets 0..5, octets 6..7 zero.
  EXPECT_EQ(NodeGuid(kMac, "siwx_eth0"), (Guid{0x02, 0xFC, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00}));
}

TEST(ProviderIdentityTest, NodeGuidWithoutMacIsTheFirstSixNameCharacters) {
  EXPECT_EQ(NodeGuid(kNoMac, "siwx_lo"), (Guid{'s', 'i', 'w', 'x', '_', 'l', 0, 0}));
  EXPECT_EQ(NodeGuid(kNoMac, "ab"), (Guid{'a', 'b', 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(NodeGuid(kNoMac, ""), (Guid{}));
}

TEST(ProviderIdentityTest, InterfaceIdIsModifiedEui64OfTheMac) {
  // RFC 4291 appendix A: invert the universal/local bit, insert ff:fe.
  EXPECT_EQ(InterfaceId(kMac, "siwx_eth0"),
            (Guid{0x00, 0xFC, 0x00, 0xFF, 0xFE, 0x00, 0x00, 0x01}));
  EXPECT_EQ(InterfaceId(kUniversalMac, "siwx_eth1"),
            (Guid{0x02, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55}));
}

TEST(ProviderIdentityTest, InterfaceIdWithoutMacIsTheNodeGuid) {
  EXPECT_EQ(InterfaceId(kNoMac, "siwx_lo"), (Guid{'s', 'i', 'w', 'x', '_', 'l', 0, 0}));
}

TEST(ProviderIdentityTest, GidHasZeroSubnetPrefixAndTheInterfaceId) {
  EXPECT_EQ(PortGid(kMac, "siwx_eth0"),
            (GidBytes{0, 0, 0, 0, 0, 0, 0, 0,                            // subnet prefix
                      0x00, 0xFC, 0x00, 0xFF, 0xFE, 0x00, 0x00, 0x01}));  // interface id
  EXPECT_EQ(PortGid(kNoMac, "siwx_lo"),
            (GidBytes{0, 0, 0, 0, 0, 0, 0, 0, 's', 'i', 'w', 'x', '_', 'l', 0, 0}));
}

TEST(ProviderIdentityTest, IsZeroTellsMissingMacs) {
  EXPECT_TRUE(IsZero(kNoMac));
  EXPECT_FALSE(IsZero(kMac));
  EXPECT_FALSE(IsZero(MacAddress{0, 0, 0, 0, 0, 1}));
}

TEST(ProviderIdentityTest, IbMtuRoundsDownToTheEnumAndNeverBelow256) {
  struct Case {
    std::uint32_t bytes;
    std::uint32_t ib_mtu;  // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
  };
  for (const Case& c : {Case{0, 1}, Case{255, 1}, Case{256, 1}, Case{511, 1}, Case{512, 2},
                        Case{1023, 2}, Case{1024, 3}, Case{1500, 3}, Case{2047, 3},
                        Case{2048, 4}, Case{4095, 4}, Case{4096, 5}, Case{9000, 5},
                        Case{65536, 5}, Case{UINT32_MAX, 5}}) {
    EXPECT_EQ(IbMtuFromBytes(c.bytes), c.ib_mtu) << "mtu " << c.bytes;
  }
}

}  // namespace
}  // namespace siwx::provider
