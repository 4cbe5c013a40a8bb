// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The environment parser and the mapping to the negotiator and to the
// provider handover struct.
#include "rdmacm-ext/cm_config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {
namespace {

CmConfig Parse(const std::map<std::string, std::string>& env) {
  return ParseCmConfig([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(CmConfig, DefaultsInteroperateWithLinuxSiw) {
  const CmConfig c = Parse({});
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.mpa.dialect, mpa::MpaDialect::kV2);  // siw: mpa_version = 2
  EXPECT_EQ(c.mpa.crc, Policy::kAllow);             // siw: CRC off unless asked
  EXPECT_EQ(c.mpa.markers, Policy::kAllow);         // never ask for markers
  EXPECT_FALSE(c.mpa.peer_to_peer);                 // siw: peer_to_peer = false
  EXPECT_EQ(c.mpa.rtr_types, (mpa::RtrTypeSet{true, true, true}));
  // L (siw's GSO_EXP bit) is an RFC 5044 Res bit: never sent by default.
  EXPECT_FALSE(c.mpa.large_fpdus);
  EXPECT_EQ(c.mpa.connect_timeout.count(), 10000);
  EXPECT_EQ(c.mpa.mpa_timeout.count(), 10000);
}

TEST(CmConfig, LargeFpdus) {
  EXPECT_FALSE(Parse({{"SIWX_MPA_LARGE_FPDUS", "0"}}).mpa.large_fpdus);
  EXPECT_TRUE(Parse({{"SIWX_MPA_LARGE_FPDUS", "1"}}).mpa.large_fpdus);
  EXPECT_FALSE(Parse({{"SIWX_MPA_LARGE_FPDUS", ""}}).mpa.large_fpdus);
  const CmConfig bad = Parse({{"SIWX_MPA_LARGE_FPDUS", "yes"}});
  EXPECT_FALSE(bad.mpa.large_fpdus);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0], "SIWX_MPA_LARGE_FPDUS='yes' is not 1 or 0 (using 0)");
}

TEST(CmConfig, Dialects) {
  EXPECT_EQ(Parse({{"SIWX_MPA_DIALECT", "v1"}}).mpa.dialect, mpa::MpaDialect::kV1);
  EXPECT_EQ(Parse({{"SIWX_MPA_DIALECT", "v1-rtr"}}).mpa.dialect, mpa::MpaDialect::kV1Rtr);
  EXPECT_EQ(Parse({{"SIWX_MPA_DIALECT", "V2"}}).mpa.dialect, mpa::MpaDialect::kV2);
  const CmConfig bad = Parse({{"SIWX_MPA_DIALECT", "v3"}});
  EXPECT_EQ(bad.mpa.dialect, mpa::MpaDialect::kV2);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0], "SIWX_MPA_DIALECT='v3' is not v2, v1-rtr or v1 (using v2)");
}

TEST(CmConfig, EmptyValueIsUnset) {
  const CmConfig c = Parse({{"SIWX_MPA_DIALECT", ""}, {"SIWX_MPA_CRC", ""}});
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.mpa.dialect, mpa::MpaDialect::kV2);
}

TEST(CmConfig, Policies) {
  EXPECT_EQ(Parse({{"SIWX_MPA_CRC", "require"}}).mpa.crc, Policy::kRequire);
  EXPECT_EQ(Parse({{"SIWX_MPA_CRC", "refuse"}}).mpa.crc, Policy::kRefuse);
  EXPECT_EQ(Parse({{"SIWX_MPA_CRC", "allow"}}).mpa.crc, Policy::kAllow);
  EXPECT_EQ(Parse({{"SIWX_MPA_MARKERS", "require"}}).mpa.markers, Policy::kRequire);
  EXPECT_EQ(Parse({{"SIWX_MPA_MARKERS", "refuse"}}).mpa.markers, Policy::kRefuse);
  const CmConfig bad = Parse({{"SIWX_MPA_CRC", "on"}});
  EXPECT_EQ(bad.mpa.crc, Policy::kAllow);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0], "SIWX_MPA_CRC='on' is not allow, require or refuse (using allow)");
}

TEST(CmConfig, PeerToPeer) {
  const CmConfig on = Parse({{"SIWX_MPA_P2P", "on"}});
  EXPECT_TRUE(on.mpa.peer_to_peer);
  EXPECT_EQ(on.mpa.rtr_types, (mpa::RtrTypeSet{true, true, true}));
  const CmConfig list = Parse({{"SIWX_MPA_P2P", "read,send"}});
  EXPECT_TRUE(list.problems.empty());
  EXPECT_TRUE(list.mpa.peer_to_peer);
  EXPECT_EQ(list.mpa.rtr_types, (mpa::RtrTypeSet{true, false, true}));
  const CmConfig off = Parse({{"SIWX_MPA_P2P", "off"}});
  EXPECT_FALSE(off.mpa.peer_to_peer);
  for (const char* bad : {"write,", "fly", ",read", "write,,read"}) {
    const CmConfig c = Parse({{"SIWX_MPA_P2P", bad}});
    EXPECT_FALSE(c.mpa.peer_to_peer) << bad;
    EXPECT_EQ(c.mpa.rtr_types, (mpa::RtrTypeSet{true, true, true})) << bad;
    ASSERT_EQ(c.problems.size(), 1u) << bad;
  }
}

TEST(CmConfig, PeerToPeerNeedsV2) {
  const CmConfig c = Parse({{"SIWX_MPA_P2P", "on"}, {"SIWX_MPA_DIALECT", "v1-rtr"}});
  EXPECT_FALSE(c.mpa.peer_to_peer);
  ASSERT_EQ(c.problems.size(), 1u);
  EXPECT_EQ(c.problems[0],
            "SIWX_MPA_P2P needs SIWX_MPA_DIALECT=v2 (peer-to-peer RTR is RFC 6581's); not "
            "requesting it");
}

TEST(CmConfig, Timeouts) {
  const CmConfig c =
      Parse({{"SIWX_CM_CONNECT_TIMEOUT_MS", "250"}, {"SIWX_MPA_TIMEOUT_MS", "600000"}});
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.mpa.connect_timeout.count(), 250);
  EXPECT_EQ(c.mpa.mpa_timeout.count(), 600000);
  for (const char* bad : {"0", "600001", "-5", "10ms", "", " 5"}) {
    const CmConfig b = Parse({{"SIWX_MPA_TIMEOUT_MS", bad}});
    EXPECT_EQ(b.mpa.mpa_timeout.count(), 10000) << bad;
    EXPECT_EQ(b.problems.size(), std::string(bad).empty() ? 0u : 1u) << bad;
  }
  EXPECT_EQ(Parse({{"SIWX_MPA_TIMEOUT_MS", "0"}}).problems[0],
            "SIWX_MPA_TIMEOUT_MS='0' is not a number of milliseconds in 1..600000 (using 10000)");
}

TEST(CmConfig, HalfOpenBounds) {
  const CmConfig d = Parse({});
  EXPECT_EQ(d.half_open_max, 256u);
  EXPECT_EQ(d.half_open_per_source, 32u);
  const CmConfig c =
      Parse({{"SIWX_CM_HALF_OPEN_MAX", "1000"}, {"SIWX_CM_HALF_OPEN_PER_SOURCE", "7"}});
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.half_open_max, 1000u);
  EXPECT_EQ(c.half_open_per_source, 7u);
  // The per-source bound never exceeds the total.
  const CmConfig t = Parse({{"SIWX_CM_HALF_OPEN_MAX", "4"}});
  EXPECT_EQ(t.half_open_per_source, 4u);
  for (const char* bad : {"0", "65537", "-1", "ten"}) {
    const CmConfig b = Parse({{"SIWX_CM_HALF_OPEN_PER_SOURCE", bad}});
    EXPECT_EQ(b.half_open_per_source, 32u) << bad;
    ASSERT_EQ(b.problems.size(), 1u) << bad;
  }
  EXPECT_EQ(Parse({{"SIWX_CM_HALF_OPEN_MAX", "0"}}).problems[0],
            "SIWX_CM_HALF_OPEN_MAX='0' is not a number in 1..65536 (using 256)");
}

TEST(CmConfig, NegotiatorConfigForEachRole) {
  MpaOptions o;
  o.crc = Policy::kRequire;
  o.markers = Policy::kRefuse;
  o.peer_to_peer = true;
  o.rtr_types = {false, true, false};
  o.mpa_timeout = std::chrono::milliseconds(1500);
  const mpa::NegotiatorConfig i = MakeNegotiatorConfig(o, mpa::MpaRole::kInitiator, 3, 4);
  EXPECT_EQ(i.role, mpa::MpaRole::kInitiator);
  EXPECT_EQ(i.dialect, mpa::MpaDialect::kV2);
  EXPECT_EQ(i.crc, mpa::CrcPolicy::kRequire);
  EXPECT_FALSE(i.markers_wanted);
  EXPECT_FALSE(i.markers_can_send);
  EXPECT_EQ(i.ird, 3);
  EXPECT_EQ(i.ord, 4);
  EXPECT_TRUE(i.peer_to_peer);
  EXPECT_EQ(i.rtr_types, (mpa::RtrTypeSet{false, true, false}));
  EXPECT_EQ(i.startup_timeout.count(), 1500000);
  EXPECT_EQ(i.first_fpdu_timeout.count(), 0);  // the engine's wait after the handover
  EXPECT_FALSE(i.large_fpdus);  // by default
  const mpa::NegotiatorConfig r = MakeNegotiatorConfig(o, mpa::MpaRole::kResponder, 0, 0);
  EXPECT_FALSE(r.peer_to_peer);  // the Initiator asks; the Responder answers
  EXPECT_FALSE(r.large_fpdus);
  o.large_fpdus = true;          // opted in: both roles offer or accept L
  EXPECT_TRUE(MakeNegotiatorConfig(o, mpa::MpaRole::kResponder, 0, 0).large_fpdus);
  EXPECT_TRUE(MakeNegotiatorConfig(o, mpa::MpaRole::kInitiator, 1, 1).large_fpdus);
  o.large_fpdus = false;
  o.markers = Policy::kRequire;
  const mpa::NegotiatorConfig m = MakeNegotiatorConfig(o, mpa::MpaRole::kInitiator, 1, 1);
  EXPECT_TRUE(m.markers_wanted);
  EXPECT_TRUE(m.markers_can_send);
}

TEST(StreamParams, InitiatorWithWriteRtr) {
  mpa::NegotiatedParams p;
  p.dialect = mpa::MpaDialect::kV2;
  p.revision = 2;
  p.crc = true;
  p.markers_tx = true;
  p.ird = 7;
  p.ord = 5;
  p.peer_to_peer = true;
  p.rtr_types = {false, true, true};
  p.rtr = mpa::RtrType::kWrite;
  p.first_send = mpa::FirstSendRule::kRtrFpduFirst;
  const siwx_stream_params s = MakeStreamParams(p, mpa::MpaRole::kInitiator, 900);
  EXPECT_EQ(s.size, sizeof(siwx_stream_params));
  EXPECT_EQ(s.mpa_dialect, SIWX_MPA_DIALECT_V2);
  EXPECT_EQ(s.mpa_revision, 2);
  EXPECT_EQ(s.crc, 1);
  EXPECT_EQ(s.tx_markers, 1);
  EXPECT_EQ(s.rx_markers, 0);
  EXPECT_EQ(s.ird, 7u);
  EXPECT_EQ(s.ord, 5u);
  EXPECT_EQ(s.rtr_role, SIWX_RTR_ROLE_SEND);
  EXPECT_EQ(s.rtr_message, SIWX_RTR_MESSAGE_WRITE);
  EXPECT_EQ(s.rtr_accept_mask, 0);
  EXPECT_EQ(s.wait_first_fpdu, 0);
  EXPECT_EQ(s.first_fpdu_timeout_ms, 0u);
  EXPECT_EQ(s.tx_marker_grid_offset, 0u);
  EXPECT_EQ(s.max_ulpdu, 0u);
  EXPECT_EQ(s.large_fpdus, 0);  // not agreed: MULPDU from the EMSS
  p.large_fpdus = true;
  EXPECT_EQ(MakeStreamParams(p, mpa::MpaRole::kInitiator, 900).large_fpdus, 1);
  EXPECT_EQ(MakeStreamParams(p, mpa::MpaRole::kResponder, 900).large_fpdus, 1);
}

TEST(StreamParams, ResponderAwaitsRtrAndFirstFpdu) {
  mpa::NegotiatedParams p;
  p.dialect = mpa::MpaDialect::kV2;
  p.revision = 2;
  p.peer_to_peer = true;
  p.rtr_types = {true, false, true};
  p.first_send = mpa::FirstSendRule::kAfterFirstFpdu;
  const siwx_stream_params s = MakeStreamParams(p, mpa::MpaRole::kResponder, 900);
  EXPECT_EQ(s.rtr_role, SIWX_RTR_ROLE_AWAIT);
  EXPECT_EQ(s.rtr_accept_mask, SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_READ);
  EXPECT_EQ(s.wait_first_fpdu, 1);
  EXPECT_EQ(s.first_fpdu_timeout_ms, 900u);
}

TEST(StreamParams, RtrFrameDialectNeedsNoFpduRtr) {
  mpa::NegotiatedParams p;
  p.dialect = mpa::MpaDialect::kV1Rtr;
  p.revision = 1;
  p.first_send = mpa::FirstSendRule::kMayNow;
  const siwx_stream_params s = MakeStreamParams(p, mpa::MpaRole::kResponder, 900);
  EXPECT_EQ(s.mpa_dialect, SIWX_MPA_DIALECT_V1_RTR);
  EXPECT_EQ(s.rtr_role, SIWX_RTR_ROLE_NONE);
  EXPECT_EQ(s.wait_first_fpdu, 0);
  EXPECT_EQ(s.first_fpdu_timeout_ms, 0u);
}

}  // namespace
}  // namespace siwx::cm
