// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA startup negotiation: RFC 5044 7.1.2 (the ten rules), the Rtr/S-bit
// proposal and RFC 6581, driven as two negotiators back to back and as one
// negotiator against hand-built frames.
#include "common/mpa/mpa_negotiator.h"

#include <gtest/gtest.h>

#include "common/wire/terminate.h"

#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace siwx::mpa {
namespace {

using Bytes = std::vector<std::uint8_t>;
using rdmap::TerminateCause;
using rdmap::TerminateCauseFromMpaError;

MpaTime T(std::int64_t us) { return MpaTime(us); }
Bytes Ascii(std::string_view s) { return Bytes(s.begin(), s.end()); }
Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

constexpr std::string_view kReq = "MPA ID Req Frame";
constexpr std::string_view kRep = "MPA ID Rep Frame";
constexpr std::string_view kRtr = "MPA ID RtR Frame";

// A startup frame built by hand: key, the M/C/R/X/Res/Rev word, PD_Length
// (from the private data unless given), private data.
Bytes Frame(std::string_view key, std::uint16_t flags_rev, const Bytes& pd = {},
            int pd_length = -1) {
  const std::uint16_t len =
      pd_length < 0 ? static_cast<std::uint16_t>(pd.size()) : static_cast<std::uint16_t>(pd_length);
  Bytes b(key.begin(), key.end());
  b.push_back(static_cast<std::uint8_t>(flags_rev >> 8));
  b.push_back(static_cast<std::uint8_t>(flags_rev));
  b.push_back(static_cast<std::uint8_t>(len >> 8));
  b.push_back(static_cast<std::uint8_t>(len));
  b.insert(b.end(), pd.begin(), pd.end());
  return b;
}
// The RFC 6581 word: the IRD half and ORD half with their flag bits.
Bytes Word(std::uint16_t ird_half, std::uint16_t ord_half) {
  return {static_cast<std::uint8_t>(ird_half >> 8), static_cast<std::uint8_t>(ird_half),
          static_cast<std::uint8_t>(ord_half >> 8), static_cast<std::uint8_t>(ord_half)};
}

Bytes Pending(const MpaNegotiator& n) {
  const ByteSpan s = n.PendingOutput();
  return Bytes(s.begin(), s.end());
}

std::vector<NegotiatorEvent> DrainEvents(MpaNegotiator& n) {
  std::vector<NegotiatorEvent> out;
  while (auto e = n.NextEvent()) out.push_back(*e);
  return out;
}

NegotiatorConfig Initiator(MpaDialect d = MpaDialect::kV2) {
  NegotiatorConfig c;
  c.role = MpaRole::kInitiator;
  c.dialect = d;
  c.startup_timeout = T(1000);
  c.first_fpdu_timeout = T(500);
  return c;
}
NegotiatorConfig Responder(MpaDialect d = MpaDialect::kV2) {
  NegotiatorConfig c = Initiator(d);
  c.role = MpaRole::kResponder;
  return c;
}

// ---------------------------------------------------------------------------
// Back-to-back harness.

enum class Chunking { kWhole, kByteAtATime, kRandom };

struct Endpoint {
  explicit Endpoint(const NegotiatorConfig& c) : n(c) {}
  MpaNegotiator n;
  std::vector<NegotiatorEvent> events;
  Bytes sent;     // every octet it put on the wire
  Bytes residue;  // octets delivered to it that Feed() left alone
};

void Transfer(Endpoint& from, Endpoint& to, MpaTime now, Chunking chunking, std::mt19937& rng) {
  const Bytes data = Pending(from.n);
  from.n.ConsumeOutput(data.size());
  from.sent.insert(from.sent.end(), data.begin(), data.end());
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t len = data.size() - pos;
    if (chunking == Chunking::kByteAtATime) len = 1;
    if (chunking == Chunking::kRandom) {
      len = std::uniform_int_distribution<std::size_t>(1, std::min<std::size_t>(len, 37))(rng);
    }
    if (!to.residue.empty()) {  // once something was refused, the rest is not startup data
      to.residue.insert(to.residue.end(), data.begin() + pos, data.begin() + pos + len);
    } else {
      const std::size_t used = to.n.Feed(now, ByteSpan(data).subspan(pos, len));
      to.residue.insert(to.residue.end(), data.begin() + pos + used, data.begin() + pos + len);
    }
    pos += len;
  }
}

struct Scenario {
  NegotiatorConfig ini = Initiator();
  NegotiatorConfig resp = Responder();
  Bytes ini_pd;
  bool reject = false;
  Bytes reply_pd;
  std::uint16_t accept_ird = 1;
  std::uint16_t accept_ord = 1;
  std::uint16_t reject_ird = 0;
  std::uint16_t reject_ord = 0;
};

struct Outcome {
  std::unique_ptr<Endpoint> ini;
  std::unique_ptr<Endpoint> resp;
};

Outcome Run(const Scenario& s, Chunking chunking, unsigned seed = 1) {
  std::mt19937 rng(seed);
  Outcome o{std::make_unique<Endpoint>(s.ini), std::make_unique<Endpoint>(s.resp)};
  EXPECT_EQ(o.resp->n.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(o.ini->n.Start(T(0), s.ini_pd), NegotiatorStatus::kOk);
  MpaTime now = T(0);
  for (int round = 0; round < 6; ++round) {
    now += T(10);
    Transfer(*o.ini, *o.resp, now, chunking, rng);
    for (const NegotiatorEvent& e : DrainEvents(o.resp->n)) {
      o.resp->events.push_back(e);
      if (e.type != NegotiatorEventType::kRequestReceived) continue;
      const NegotiatorStatus st =
          s.reject ? o.resp->n.Reject(s.reply_pd, s.reject_ird, s.reject_ord)
                   : o.resp->n.Accept(now, s.reply_pd, s.accept_ird, s.accept_ord);
      EXPECT_EQ(st, NegotiatorStatus::kOk);
      for (const NegotiatorEvent& e2 : DrainEvents(o.resp->n)) o.resp->events.push_back(e2);
    }
    Transfer(*o.resp, *o.ini, now, chunking, rng);
    for (const NegotiatorEvent& e : DrainEvents(o.ini->n)) o.ini->events.push_back(e);
    if (o.ini->n.PendingOutput().empty() && o.resp->n.PendingOutput().empty()) break;
  }
  return o;
}

std::string Hex(const Bytes& b) {
  std::ostringstream os;
  for (std::uint8_t x : b) os << std::hex << (x >> 4) << (x & 15);
  return os.str();
}

std::string Describe(const Endpoint& e) {
  std::ostringstream os;
  os << "state=" << NegotiatorStateName(e.n.state()) << " events=[";
  for (const NegotiatorEvent& ev : e.events) {
    os << NegotiatorEventTypeName(ev.type) << "/" << int(ev.error) << "/"
       << StartupFailureName(ev.failure) << "/" << ev.by_peer << "/" << ev.send_terminate << "/"
       << ev.reason << ";";
  }
  const NegotiatedParams& p = e.n.params();
  os << "] dialect=" << int(p.dialect) << " rev=" << int(p.revision) << " crc=" << p.crc
     << " mtx=" << p.markers_tx << " mrx=" << p.markers_rx << " large=" << p.large_fpdus
     << " x=" << p.ird_ord_exchanged
     << " ird=" << p.ird << " ord=" << p.ord << " peer_word=";
  if (p.peer_ird_ord) {
    os << p.peer_ird_ord->ird << "," << p.peer_ird_ord->ord << "," << p.peer_ird_ord->peer_to_peer
       << p.peer_ird_ord->send_rtr << p.peer_ird_ord->write_rtr << p.peer_ird_ord->read_rtr;
  }
  os << " p2p=" << p.peer_to_peer << " types=" << p.rtr_types.send << p.rtr_types.write
     << p.rtr_types.read << " rtr=" << int(p.rtr)
     << " first=" << int(p.first_send) << " lpd=" << Hex(p.local_private_data)
     << " ppd=" << Hex(p.peer_private_data) << " sent=" << Hex(e.sent)
     << " residue=" << Hex(e.residue);
  return os.str();
}

std::string Describe(const Outcome& o) {
  return "INI " + Describe(*o.ini) + "\nRESP " + Describe(*o.resp);
}

// Runs whole, byte-at-a-time and with several random chunkings; all must
// agree. Returns the whole-feed outcome.
Outcome RunAllWays(const Scenario& s) {
  Outcome whole = Run(s, Chunking::kWhole);
  const std::string expected = Describe(whole);
  EXPECT_EQ(Describe(Run(s, Chunking::kByteAtATime)), expected) << "byte at a time";
  for (unsigned seed = 1; seed <= 4; ++seed) {
    EXPECT_EQ(Describe(Run(s, Chunking::kRandom, seed)), expected) << "random chunks seed " << seed;
  }
  return whole;
}

std::uint16_t FlagsAt(const Bytes& wire, std::size_t frame_offset) {
  return static_cast<std::uint16_t>((wire.at(frame_offset + 16) << 8) | wire.at(frame_offset + 17));
}
std::uint16_t PdLengthAt(const Bytes& wire, std::size_t frame_offset) {
  return static_cast<std::uint16_t>((wire.at(frame_offset + 18) << 8) | wire.at(frame_offset + 19));
}
std::string KeyAt(const Bytes& wire, std::size_t frame_offset) {
  return std::string(wire.begin() + static_cast<std::ptrdiff_t>(frame_offset),
                     wire.begin() + static_cast<std::ptrdiff_t>(frame_offset + 16));
}

// ---------------------------------------------------------------------------
// The matrix: Initiator dialect x Responder dialect x CRC policies x markers
// x large FPDUs (the L bit) offered / accepted.

using MatrixParam =
    std::tuple<MpaDialect, MpaDialect, CrcPolicy, CrcPolicy, bool, bool, bool, bool>;

class NegotiationMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(NegotiationMatrix, BackToBack) {
  const auto [di, dr, ci, cr, mi, mr, li, lr] = GetParam();
  Scenario s;
  s.ini = Initiator(di);
  s.ini.crc = ci;
  s.ini.markers_wanted = mi;
  s.ini.large_fpdus = li;
  s.ini.ird = 4;
  s.ini.ord = 8;
  s.resp = Responder(dr);
  s.resp.crc = cr;
  s.resp.markers_wanted = mr;
  s.resp.large_fpdus = lr;
  s.ini_pd = Ascii("init-pd");
  s.reply_pd = Ascii("resp-pd!");
  s.accept_ird = 20;
  s.accept_ord = 3;
  const Outcome o = RunAllWays(s);

  // What the three dialects make of each other. RFC 6581 10: a Responder
  // without enhanced establishment closes on an enhanced Request; it does
  // not answer it in Rev 1.
  const bool enhanced_refused = di == MpaDialect::kV2 && dr != MpaDialect::kV2;
  MpaDialect dialect = MpaDialect::kV1;
  if (di == MpaDialect::kV2 && dr == MpaDialect::kV2) dialect = MpaDialect::kV2;
  if (di == MpaDialect::kV1Rtr && dr != MpaDialect::kV1) dialect = MpaDialect::kV1Rtr;
  const std::uint8_t rev = dialect == MpaDialect::kV2 ? 2 : 1;
  const bool req_c = ci == CrcPolicy::kRequire;
  const bool resp_rejects = req_c && cr == CrcPolicy::kRefuse;
  const bool reply_c = req_c || cr == CrcPolicy::kRequire;
  const bool ini_fails = !resp_rejects && reply_c && ci == CrcPolicy::kRefuse;
  // L answers L in an accepting Reply, in every dialect.
  const bool large = li && lr;

  // The Request as sent.
  const Bytes& iw = o.ini->sent;
  ASSERT_GE(iw.size(), 20u);
  EXPECT_EQ(KeyAt(iw, 0), kReq);
  EXPECT_EQ(FlagsAt(iw, 0), (mi ? 0x8000 : 0) | (req_c ? 0x4000 : 0) |
                                (di != MpaDialect::kV1 ? 0x1000 : 0) | (li ? 0x0800 : 0) |
                                (di == MpaDialect::kV2 ? 2 : 1));
  EXPECT_EQ(PdLengthAt(iw, 0), (di == MpaDialect::kV2 ? 4 : 0) + 7);
  if (di == MpaDialect::kV2) {
    EXPECT_EQ(Bytes(iw.begin() + 20, iw.begin() + 24), Word(4, 8));  // IRD 4, ORD 8, no flags
  }

  if (enhanced_refused) {
    EXPECT_TRUE(o.resp->sent.empty());  // no Reply at all
    EXPECT_EQ(o.resp->n.state(), NegotiatorState::kFailed);
    ASSERT_EQ(o.resp->events.size(), 1u);
    EXPECT_EQ(o.resp->events[0].type, NegotiatorEventType::kFailed);
    EXPECT_EQ(o.resp->events[0].error, MpaError::kInvalidStartupFrame);
    EXPECT_EQ(o.resp->events[0].failure, StartupFailure::kEnhancedUnsupported);
    EXPECT_FALSE(o.resp->events[0].send_terminate);
    EXPECT_EQ(o.ini->n.state(), NegotiatorState::kAwaitingReply);  // until the close or timeout
    EXPECT_TRUE(o.ini->events.empty());
    return;
  }

  // The Reply as sent.
  const Bytes& rw = o.resp->sent;
  ASSERT_GE(rw.size(), 20u);
  EXPECT_EQ(KeyAt(rw, 0), kRep);
  if (resp_rejects) {
    EXPECT_EQ(FlagsAt(rw, 0), 0x2000 | (dialect == MpaDialect::kV2 ? 0x1000 : 0) | rev);  // no L
    EXPECT_FALSE(o.ini->n.params().large_fpdus);
    EXPECT_EQ(o.resp->n.state(), NegotiatorState::kRejected);
    ASSERT_EQ(o.resp->events.size(), 1u);
    EXPECT_EQ(o.resp->events[0].type, NegotiatorEventType::kRejected);
    EXPECT_EQ(o.resp->events[0].failure, StartupFailure::kCrcRefused);
    EXPECT_FALSE(o.resp->events[0].by_peer);
    EXPECT_EQ(o.ini->n.state(), NegotiatorState::kRejected);
    ASSERT_EQ(o.ini->events.size(), 1u);
    EXPECT_EQ(o.ini->events[0].type, NegotiatorEventType::kRejected);
    EXPECT_TRUE(o.ini->events[0].by_peer);
    EXPECT_EQ(o.ini->events[0].error, MpaError::kNone);
    EXPECT_TRUE(o.ini->residue.empty());
    return;
  }
  const bool x_reply = dialect == MpaDialect::kV2 || dialect == MpaDialect::kV1Rtr;
  EXPECT_EQ(FlagsAt(rw, 0),
            (mr ? 0x8000 : 0) | (reply_c ? 0x4000 : 0) | (x_reply ? 0x1000 : 0) |
                (large ? 0x0800 : 0) | rev);
  EXPECT_EQ(o.resp->n.offer().large_fpdus, li);
  EXPECT_EQ(PdLengthAt(rw, 0), (dialect == MpaDialect::kV2 ? 4 : 0) + 8);
  if (dialect == MpaDialect::kV2) {
    // min(20, peer ORD 8), min(3, peer IRD 4)
    EXPECT_EQ(Bytes(rw.begin() + 20, rw.begin() + 24), Word(8, 3));
  }
  EXPECT_EQ(rw.size(), 20u + PdLengthAt(rw, 0));

  ASSERT_GE(o.resp->events.size(), 1u);
  EXPECT_EQ(o.resp->events[0].type, NegotiatorEventType::kRequestReceived);
  EXPECT_EQ(o.resp->n.offer().answer_dialect, dialect);
  EXPECT_EQ(o.resp->n.offer().private_data, Ascii("init-pd"));

  if (ini_fails) {
    EXPECT_EQ(o.ini->n.state(), NegotiatorState::kFailed);
    ASSERT_EQ(o.ini->events.size(), 1u);
    EXPECT_EQ(o.ini->events[0].type, NegotiatorEventType::kFailed);
    EXPECT_EQ(o.ini->events[0].error, MpaError::kInvalidStartupFrame);
    EXPECT_EQ(o.ini->events[0].failure, StartupFailure::kCrcRefused);
    EXPECT_EQ(iw.size(), 20u + PdLengthAt(iw, 0));  // no Rtr frame
    return;
  }

  // Both established.
  EXPECT_EQ(o.ini->n.state(), NegotiatorState::kFullOperation);
  ASSERT_EQ(o.ini->events.size(), 1u);
  EXPECT_EQ(o.ini->events[0].type, NegotiatorEventType::kEstablished);
  ASSERT_EQ(o.resp->events.size(), 2u);
  EXPECT_EQ(o.resp->events[1].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(o.resp->n.state(), dialect == MpaDialect::kV1Rtr ? NegotiatorState::kFullOperation
                                                             : NegotiatorState::kAwaitingFirstFpdu);
  if (dialect == MpaDialect::kV1Rtr) {
    // The Rtr frame follows the Request: C copied from the Reply, M ours.
    const std::size_t at = 20u + PdLengthAt(iw, 0);
    ASSERT_EQ(iw.size(), at + 20u);
    EXPECT_EQ(KeyAt(iw, at), kRtr);
    EXPECT_EQ(FlagsAt(iw, at), (mi ? 0x8000 : 0) | (reply_c ? 0x4000 : 0) | 1);  // never L
    EXPECT_EQ(PdLengthAt(iw, at), 0);
  } else {
    EXPECT_EQ(iw.size(), 20u + PdLengthAt(iw, 0));
  }

  const NegotiatedParams& ip = o.ini->n.params();
  const NegotiatedParams& rp = o.resp->n.params();
  for (const NegotiatedParams* p : {&ip, &rp}) {
    EXPECT_EQ(p->dialect, dialect);
    EXPECT_EQ(p->revision, rev);
    EXPECT_EQ(p->crc, reply_c);
    EXPECT_FALSE(p->peer_to_peer);
    EXPECT_EQ(p->rtr, RtrType::kNone);
    EXPECT_EQ(p->rtr_types, (RtrTypeSet{false, false, false}));
    EXPECT_EQ(p->ird_ord_exchanged, dialect == MpaDialect::kV2);
    EXPECT_EQ(p->large_fpdus, large);
  }
  if (dialect == MpaDialect::kV2) {
    // RFC 6581 9.1: each end passes the peer's word to its ULP unchanged.
    EXPECT_EQ(ip.peer_ird_ord, (IrdOrdWord{8, 3, false, false, false, false}));
    EXPECT_EQ(rp.peer_ird_ord, (IrdOrdWord{4, 8, false, false, false, false}));
  } else {
    EXPECT_EQ(ip.peer_ird_ord, std::nullopt);
    EXPECT_EQ(rp.peer_ird_ord, std::nullopt);
  }
  EXPECT_EQ(ip.markers_tx, mr);
  EXPECT_EQ(ip.markers_rx, mi);
  EXPECT_EQ(rp.markers_tx, mi);
  EXPECT_EQ(rp.markers_rx, mr);
  EXPECT_EQ(ip.first_send, FirstSendRule::kMayNow);
  EXPECT_EQ(rp.first_send, dialect == MpaDialect::kV1Rtr ? FirstSendRule::kMayNow
                                                         : FirstSendRule::kAfterFirstFpdu);
  if (dialect == MpaDialect::kV2) {
    EXPECT_EQ(ip.ird, 3);  // the Responder's ORD
    EXPECT_EQ(ip.ord, 8);  // min(8, Responder IRD 8)
    EXPECT_EQ(rp.ird, 8);
    EXPECT_EQ(rp.ord, 3);
  } else {
    EXPECT_EQ(ip.ird, 4);  // unexchanged: local values
    EXPECT_EQ(ip.ord, 8);
    EXPECT_EQ(rp.ird, 20);
    EXPECT_EQ(rp.ord, 3);
  }
  EXPECT_EQ(ip.local_private_data, Ascii("init-pd"));
  EXPECT_EQ(ip.peer_private_data, Ascii("resp-pd!"));
  EXPECT_EQ(rp.local_private_data, Ascii("resp-pd!"));
  EXPECT_EQ(rp.peer_private_data, Ascii("init-pd"));
  EXPECT_TRUE(o.ini->residue.empty());
  EXPECT_TRUE(o.resp->residue.empty());
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto d = [](MpaDialect x) {
    return x == MpaDialect::kV1 ? "V1" : x == MpaDialect::kV1Rtr ? "V1Rtr" : "V2";
  };
  const auto c = [](CrcPolicy x) {
    return x == CrcPolicy::kRequire ? "Req" : x == CrcPolicy::kAllow ? "Allow" : "Refuse";
  };
  const auto [di, dr, ci, cr, mi, mr, li, lr] = info.param;
  return std::string(d(di)) + "_to_" + d(dr) + "_Crc" + c(ci) + c(cr) + "_M" + (mi ? "1" : "0") +
         (mr ? "1" : "0") + "_L" + (li ? "1" : "0") + (lr ? "1" : "0");
}

INSTANTIATE_TEST_SUITE_P(
    AllDialects, NegotiationMatrix,
    ::testing::Combine(
        ::testing::Values(MpaDialect::kV1, MpaDialect::kV1Rtr, MpaDialect::kV2),
        ::testing::Values(MpaDialect::kV1, MpaDialect::kV1Rtr, MpaDialect::kV2),
        ::testing::Values(CrcPolicy::kRequire, CrcPolicy::kAllow, CrcPolicy::kRefuse),
        ::testing::Values(CrcPolicy::kRequire, CrcPolicy::kAllow, CrcPolicy::kRefuse),
        ::testing::Bool(), ::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
    MatrixName);

// ---------------------------------------------------------------------------
// RFC 6581 RTR choice: offered types x accepted types.

using RtrParam = std::tuple<int, int>;  // bit 0 Send, bit 1 Write, bit 2 Read

class RtrChoice : public ::testing::TestWithParam<RtrParam> {};

RtrTypeSet SetFromMask(int m) { return {(m & 1) != 0, (m & 2) != 0, (m & 4) != 0}; }

TEST_P(RtrChoice, ResponderAdvertisesInitiatorPicks) {
  const auto [offered, accepted] = GetParam();
  Scenario s;
  s.ini.peer_to_peer = true;
  s.ini.rtr_types = SetFromMask(offered);
  s.resp.rtr_types = SetFromMask(accepted);
  const Outcome o = RunAllWays(s);

  // RFC 6581 9.2: the Responder flags every offered type it supports; when
  // it supports none of them it MUST still flag at least one type it
  // supports (here: all of them). The Initiator then picks (1.1) among the
  // flagged types it offered, Write first, then Read, then Send.
  const int common = offered & accepted;
  const int advertised = common != 0 ? common : accepted;
  const int usable = advertised & offered;
  const RtrType expected = (usable & 2)   ? RtrType::kWrite
                           : (usable & 4) ? RtrType::kRead
                           : (usable & 1) ? RtrType::kSend
                                          : RtrType::kNone;
  // Request word: A=1, B from Send | IRD 1; C from Write, D from Read | ORD 1.
  EXPECT_EQ(Bytes(o.ini->sent.begin() + 20, o.ini->sent.begin() + 24),
            Word(0x8000 | ((offered & 1) ? 0x4000 : 0) | 1,
                 ((offered & 2) ? 0x8000 : 0) | ((offered & 4) ? 0x4000 : 0) | 1));
  // Reply word: A echoed (9.2), the advertised types, IRD/ORD 1.
  EXPECT_EQ(FlagsAt(o.resp->sent, 0), 0x1002);  // accepting, S, Rev 2
  EXPECT_EQ(Bytes(o.resp->sent.begin() + 20, o.resp->sent.end()),
            Word(0x8000 | ((advertised & 1) ? 0x4000 : 0) | 1,
                 ((advertised & 2) ? 0x8000 : 0) | ((advertised & 4) ? 0x4000 : 0) | 1));
  EXPECT_EQ(o.resp->n.offer().rtr_types, SetFromMask(advertised));
  EXPECT_TRUE(o.resp->n.offer().peer_to_peer);

  // The Responder is established either way and waits for the first FPDU,
  // which must be one of the advertised RTR types; the choice is not its.
  const NegotiatedParams& rp = o.resp->n.params();
  EXPECT_EQ(o.resp->n.state(), NegotiatorState::kAwaitingFirstFpdu);
  EXPECT_TRUE(rp.peer_to_peer);
  EXPECT_EQ(rp.rtr_types, SetFromMask(advertised));
  EXPECT_EQ(rp.rtr, RtrType::kNone);
  EXPECT_EQ(rp.first_send, FirstSendRule::kAfterFirstFpdu);

  if (expected == RtrType::kNone) {
    // 9.2: nothing the Initiator can send: Terminate LLP/MPA code 7, close.
    EXPECT_EQ(o.ini->n.state(), NegotiatorState::kFailed);
    ASSERT_EQ(o.ini->events.size(), 1u);
    EXPECT_EQ(o.ini->events[0].type, NegotiatorEventType::kFailed);
    EXPECT_EQ(o.ini->events[0].error, MpaError::kNoMatchingRtr);
    EXPECT_EQ(o.ini->events[0].failure, StartupFailure::kNoMatchingRtr);
    EXPECT_TRUE(o.ini->events[0].send_terminate);
    return;
  }
  const NegotiatedParams& ip = o.ini->n.params();
  EXPECT_EQ(o.ini->n.state(), NegotiatorState::kFullOperation);
  EXPECT_TRUE(ip.peer_to_peer);
  EXPECT_EQ(ip.rtr, expected);
  EXPECT_EQ(ip.rtr_types, SetFromMask(advertised));
  EXPECT_EQ(ip.first_send, FirstSendRule::kRtrFpduFirst);
}

INSTANTIATE_TEST_SUITE_P(AllMasks, RtrChoice,
                         ::testing::Combine(::testing::Range(1, 8), ::testing::Range(1, 8)));

// ---------------------------------------------------------------------------
// Exact bytes against Linux siw.

const Bytes kSiwRequest = Cat({Ascii(kReq), {0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01}});

TEST(MpaNegotiator, V2InitiatorSendsWhatLinuxSiwSends) {
  MpaNegotiator n(Initiator());  // v2, CRC allowed, no markers, IRD 1, ORD 1
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(n), kSiwRequest);
  EXPECT_EQ(n.state(), NegotiatorState::kAwaitingReply);
  EXPECT_EQ(n.Deadline(), T(1000));
}

TEST(MpaNegotiator, ResponderAnswersLinuxSiwRequest) {
  MpaNegotiator n(Responder());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(n.Feed(T(5), kSiwRequest), 24u);
  auto ev = DrainEvents(n);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kRequestReceived);
  EXPECT_EQ(n.offer().dialect, MpaDialect::kV2);
  EXPECT_EQ(n.offer().revision, 2);
  EXPECT_EQ(n.offer().ird_ord, (IrdOrdWord{1, 1, false, false, false, false}));
  EXPECT_TRUE(n.offer().private_data.empty());
  EXPECT_EQ(n.Deadline(), std::nullopt);  // the consumer is not timed

  ASSERT_EQ(n.Accept(T(6), {}, 16, 16), NegotiatorStatus::kOk);
  // clang-format off
  EXPECT_EQ(Pending(n), Cat({Ascii(kRep),
                             {0x10, 0x02,     // enhanced | Rev 2
                              0x00, 0x04,     // PD_Length 4
                              0x00, 0x01,     // IRD min(16, peer ORD 1)
                              0x00, 0x01}}));  // ORD min(16, peer IRD 1)
  // clang-format on
  ev = DrainEvents(n);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(n.state(), NegotiatorState::kAwaitingFirstFpdu);
  EXPECT_EQ(n.Deadline(), T(506));
  EXPECT_EQ(n.params().ird, 1);
  EXPECT_EQ(n.params().ord, 1);
  EXPECT_FALSE(n.params().crc);
  EXPECT_FALSE(n.params().peer_to_peer);
  EXPECT_EQ(n.params().peer_ird_ord, (IrdOrdWord{1, 1, false, false, false, false}));
}

TEST(MpaNegotiator, ResponderAnswersPerftestZeroIrdOrd) {
  // perftest send/write tests ask IRD 0 / ORD 0: the Reply never promises
  // more than the Initiator can use (RFC 6581 9.1: ORD at most its IRD).
  MpaNegotiator n(Responder());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1002, Word(0, 0))), 24u);
  ASSERT_EQ(n.Accept(T(2), {}, 128, 128), NegotiatorStatus::kOk);
  // clang-format off
  EXPECT_EQ(Pending(n), Cat({Ascii(kRep),
                             {0x10, 0x02,     // S | Rev 2
                              0x00, 0x04,     // PD_Length 4
                              0x00, 0x00,     // A=0 B=0 IRD 0
                              0x00, 0x00}}));  // C=0 D=0 ORD 0
  // clang-format on
  EXPECT_EQ(n.params().ird, 0);
  EXPECT_EQ(n.params().ord, 0);
}

TEST(MpaNegotiator, ResponderEchoesCrcOfLinuxSiwRequest) {
  MpaNegotiator n(Responder());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  const Bytes req = Cat({Ascii(kReq), {0x50, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01}});
  EXPECT_EQ(n.Feed(T(1), req), 24u);
  ASSERT_EQ(n.Accept(T(1), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(FlagsAt(Pending(n), 0), 0x5002);
  EXPECT_TRUE(n.params().crc);
}

TEST(MpaNegotiator, ResponderClampsIrdOrdToItsLimits) {
  MpaNegotiator n(Responder());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  // Peer asks IRD 200, ORD 300.
  const Bytes req = Frame(kReq, 0x1002, Word(200, 300));
  ASSERT_EQ(n.Feed(T(1), req), 24u);
  ASSERT_EQ(n.Accept(T(1), {}, 128, 64), NegotiatorStatus::kOk);
  const Bytes out = Pending(n);
  EXPECT_EQ(Bytes(out.begin() + 20, out.end()), Word(128, 64));
  EXPECT_EQ(n.params().ird, 128);
  EXPECT_EQ(n.params().ord, 64);
  EXPECT_TRUE(n.params().ird_ord_exchanged);
}

// ---------------------------------------------------------------------------
// Initiator against crafted Replies.

struct InitiatorRun {
  std::unique_ptr<MpaNegotiator> n;
  std::size_t consumed = 0;
  std::vector<NegotiatorEvent> events;
};

InitiatorRun FeedInitiator(const NegotiatorConfig& c, const Bytes& reply, Bytes pd = {}) {
  InitiatorRun r;
  r.n = std::make_unique<MpaNegotiator>(c);
  EXPECT_EQ(r.n->Start(T(0), pd), NegotiatorStatus::kOk);
  r.n->ConsumeOutput(Pending(*r.n).size());
  r.consumed = r.n->Feed(T(10), reply);
  r.events = DrainEvents(*r.n);
  return r;
}

void ExpectFailed(const std::vector<NegotiatorEvent>& ev, MpaError error, StartupFailure failure) {
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kFailed);
  EXPECT_EQ(ev[0].error, error);
  EXPECT_EQ(ev[0].failure, failure);
  EXPECT_FALSE(ev[0].reason.empty());
  EXPECT_FALSE(ev[0].send_terminate);  // just close
}

TEST(MpaNegotiator, V2InitiatorAcceptsLinuxSiwReply) {
  // siw echoes IRD/ORD within its limits; its Reply may carry L (GSO_EXP),
  // which means nothing to an Initiator that did not offer it.
  for (std::uint16_t flags : {std::uint16_t{0x1002}, std::uint16_t{0x1802}}) {
    const Bytes reply = Frame(kRep, flags, Word(1, 1));
    const InitiatorRun r = FeedInitiator(Initiator(), reply);
    EXPECT_EQ(r.consumed, 24u);
    ASSERT_EQ(r.events.size(), 1u);
    EXPECT_EQ(r.events[0].type, NegotiatorEventType::kEstablished);
    EXPECT_EQ(r.n->params().dialect, MpaDialect::kV2);
    EXPECT_EQ(r.n->params().ird, 1);
    EXPECT_EQ(r.n->params().ord, 1);
    EXPECT_EQ(r.n->params().first_send, FirstSendRule::kMayNow);
    EXPECT_FALSE(r.n->params().large_fpdus);
  }
}

TEST(MpaNegotiator, InitiatorOffersLargeFpdusAndAgreesOnlyOnAReplyWithL) {
  // What a siw with try_gso sends (kernel iwarp.h: GSO_EXP = 0x0800), and
  // the same offer in the two Rev 1 dialects.
  struct Case {
    MpaDialect dialect;
    Bytes request;
    std::uint16_t reply_flags;  // without L
    Bytes reply_pd;
  };
  const std::vector<Case> cases = {
      {MpaDialect::kV2, Cat({Ascii(kReq), {0x18, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01}}),
       0x1002, Word(1, 1)},
      {MpaDialect::kV1Rtr, Frame(kReq, 0x1801), 0x1001, {}},
      {MpaDialect::kV1, Frame(kReq, 0x0801), 0x0001, {}},
  };
  for (const Case& c : cases) {
    NegotiatorConfig config = Initiator(c.dialect);
    config.large_fpdus = true;
    for (const bool reply_l : {false, true}) {
      SCOPED_TRACE(std::string(MpaDialectName(c.dialect)) + (reply_l ? ", Reply with L" : ""));
      MpaNegotiator n(config);
      ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
      EXPECT_EQ(Pending(n), c.request);
      n.ConsumeOutput(c.request.size());
      const std::uint16_t flags = static_cast<std::uint16_t>(c.reply_flags | (reply_l ? 0x0800 : 0));
      const Bytes reply = Frame(kRep, flags, c.reply_pd);
      EXPECT_EQ(n.Feed(T(5), reply), reply.size());
      const auto ev = DrainEvents(n);
      ASSERT_EQ(ev.size(), 1u);
      EXPECT_EQ(ev[0].type, NegotiatorEventType::kEstablished);
      EXPECT_EQ(n.params().dialect, c.dialect);
      EXPECT_EQ(n.params().large_fpdus, reply_l);
      if (c.dialect == MpaDialect::kV1Rtr) {
        EXPECT_EQ(Pending(n), Frame(kRtr, 0x0001));  // the Rtr frame carries no L
      }
    }
  }
}

TEST(MpaNegotiator, V2InitiatorRefusesAnUnenhancedReply) {
  // RFC 6581 10: "an enhanced responder is REQUIRED to respond with an
  // enhanced RDMA connection establishment response, whereas an unenhanced
  // responder treats the enhanced request as incorrectly formatted and
  // closes the TCP connection." A Rev 1 Reply is neither: it is not a
  // fallback. Accepting, rejecting, with S or without.
  for (std::uint16_t flags : {std::uint16_t{0x0001}, std::uint16_t{0x2001}, std::uint16_t{0x1001},
                              std::uint16_t{0x4001}}) {
    const InitiatorRun r = FeedInitiator(Initiator(), Frame(kRep, flags, Ascii("hi")));
    EXPECT_EQ(r.consumed, 22u) << flags;
    ExpectFailed(r.events, MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedMismatch);
    EXPECT_FALSE(r.events[0].send_terminate);
    EXPECT_EQ(r.n->state(), NegotiatorState::kFailed);
    EXPECT_TRUE(Pending(*r.n).empty());
  }
}

TEST(MpaNegotiator, V1InitiatorIgnoresAnUnofferedSBitInARev1Reply) {
  // To a v1 Initiator the bit after R is reserved: not checked (RFC 5044
  // 7.1.1), and no Rtr frame follows.
  const InitiatorRun r = FeedInitiator(Initiator(MpaDialect::kV1), Frame(kRep, 0x1001));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(r.n->params().dialect, MpaDialect::kV1);
  EXPECT_TRUE(Pending(*r.n).empty());
}

TEST(MpaNegotiator, SBitInitiatorFallsBackWhenReplyClearsS) {
  const InitiatorRun r = FeedInitiator(Initiator(MpaDialect::kV1Rtr), Frame(kRep, 0x0001));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.n->params().dialect, MpaDialect::kV1);
  EXPECT_TRUE(Pending(*r.n).empty());
}

TEST(MpaNegotiator, SBitInitiatorSendsRtrFrameWithTheRepliesC) {
  NegotiatorConfig c = Initiator(MpaDialect::kV1Rtr);
  c.markers_wanted = true;
  const InitiatorRun r = FeedInitiator(c, Frame(kRep, 0x5001));  // C=1 S=1 Rev 1
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(r.n->params().dialect, MpaDialect::kV1Rtr);
  EXPECT_EQ(Pending(*r.n), Frame(kRtr, 0xC001));  // M ours, C from the Reply, Rev 1
}

TEST(MpaNegotiator, ReplyRevisionAboveRequestFails) {
  const InitiatorRun r = FeedInitiator(Initiator(MpaDialect::kV1), Frame(kRep, 0x1002, Word(1, 1)));
  ExpectFailed(r.events, MpaError::kInvalidStartupFrame, StartupFailure::kRevisionMismatch);
  EXPECT_EQ(r.n->state(), NegotiatorState::kFailed);
}

TEST(MpaNegotiator, Rev2ReplyDroppingEnhancedBitFails) {
  const InitiatorRun r = FeedInitiator(Initiator(), Frame(kRep, 0x0002));
  ExpectFailed(r.events, MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedMismatch);
}

// A failure RFC 6581 answers with a Terminate (layer 2 LLP, type 0 MPA).
void ExpectTerminate(const std::vector<NegotiatorEvent>& ev, MpaError error,
                     StartupFailure failure) {
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kFailed);
  EXPECT_EQ(ev[0].error, error);
  EXPECT_EQ(ev[0].failure, failure);
  EXPECT_TRUE(ev[0].send_terminate);
  EXPECT_FALSE(ev[0].reason.empty());
}

TEST(MpaNegotiator, InsufficientIrdSendsTerminateCode6) {
  // RFC 6581 9.1: "If the initiator does not have sufficient resources for
  // the required IRD, it MUST send a TERM message ... Layer 2, Error Type 0,
  // Error Code 6."
  NegotiatorConfig c = Initiator();
  c.ird = 2;
  c.crc = CrcPolicy::kRequire;
  const InitiatorRun r = FeedInitiator(c, Frame(kRep, 0x1002, Word(4, 3)));  // Responder ORD 3
  ExpectTerminate(r.events, MpaError::kInsufficientIrd, StartupFailure::kInsufficientIrd);
  EXPECT_EQ(TerminateCauseFromMpaError(r.events[0].error), (TerminateCause{2, 0, 6}));
  EXPECT_EQ(r.n->state(), NegotiatorState::kFailed);
  EXPECT_TRUE(Pending(*r.n).empty());
  // The Terminate is an FPDU: the framing the Reply settled is in params().
  EXPECT_TRUE(r.n->params().crc);
  EXPECT_FALSE(r.n->params().markers_tx);
  // 9.1: the Responder's values still reach the ULP.
  EXPECT_EQ(r.n->params().peer_ird_ord, (IrdOrdWord{4, 3, false, false, false, false}));

  const InitiatorRun ok = FeedInitiator(c, Frame(kRep, 0x1002, Word(4, 2)));
  ASSERT_EQ(ok.events.size(), 1u);
  EXPECT_EQ(ok.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(ok.n->params().ird, 2);  // at least the Responder ORD 2
  EXPECT_EQ(ok.n->params().ord, 1);  // min(our ORD 1, Responder IRD 4)
}

TEST(MpaNegotiator, AllOnesIrdOrdIsLeftToTheUlp) {
  // RFC 6581 9.1: "The initiator MUST leave its local endpoint ORD value
  // unchanged upon receiving a responder IRD value of 0x3FFF" and its IRD
  // unchanged on a responder ORD of 0x3FFF (no insufficient-IRD check).
  NegotiatorConfig c = Initiator();
  c.ird = 4;
  c.ord = 8;
  const InitiatorRun both = FeedInitiator(c, Frame(kRep, 0x1002, Word(0x3FFF, 0x3FFF)));
  ASSERT_EQ(both.events.size(), 1u);
  EXPECT_EQ(both.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(both.n->params().ird, 4);
  EXPECT_EQ(both.n->params().ord, 8);
  EXPECT_EQ(both.n->params().peer_ird_ord, (IrdOrdWord{0x3FFF, 0x3FFF, false, false, false, false}));
  const InitiatorRun ird_only = FeedInitiator(c, Frame(kRep, 0x1002, Word(0x3FFF, 2)));
  ASSERT_EQ(ird_only.events.size(), 1u);
  EXPECT_EQ(ird_only.n->params().ird, 2);  // from the Responder ORD
  EXPECT_EQ(ird_only.n->params().ord, 8);  // unchanged
  const InitiatorRun ord_only = FeedInitiator(c, Frame(kRep, 0x1002, Word(5, 0x3FFF)));
  ASSERT_EQ(ord_only.events.size(), 1u);
  EXPECT_EQ(ord_only.n->params().ird, 4);  // unchanged
  EXPECT_EQ(ord_only.n->params().ord, 5);  // min(8, Responder IRD 5)
}

TEST(MpaNegotiator, ResponderEchoesAllOnesIrdOrd) {
  // RFC 6581 9.1: "The responder MUST respond to an initiator ORD value of
  // 0x3FFF by leaving its local endpoint IRD value unchanged and setting the
  // IRD to 0x3FFF in its reply message", and likewise for the IRD/ORD pair.
  {
    MpaNegotiator n(Responder());
    ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
    ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1002, Word(0x3FFF, 0x3FFF))), 24u);
    ASSERT_EQ(n.Accept(T(2), {}, 16, 8), NegotiatorStatus::kOk);
    // clang-format off
    EXPECT_EQ(Pending(n), Cat({Ascii(kRep),
                               {0x10, 0x02,     // S | Rev 2
                                0x00, 0x04,     // PD_Length 4
                                0x3F, 0xFF,     // A=0 B=0 IRD 0x3FFF
                                0x3F, 0xFF}}));  // C=0 D=0 ORD 0x3FFF
    // clang-format on
    EXPECT_EQ(n.params().ird, 16);  // local values unchanged
    EXPECT_EQ(n.params().ord, 8);
  }
  {
    MpaNegotiator n(Responder());
    ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
    ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1002, Word(5, 0x3FFF))), 24u);  // only ORD is the ULP's
    ASSERT_EQ(n.Accept(T(2), {}, 16, 8), NegotiatorStatus::kOk);
    const Bytes out = Pending(n);
    EXPECT_EQ(Bytes(out.begin() + 20, out.end()), Word(0x3FFF, 5));
    EXPECT_EQ(n.params().ird, 16);
    EXPECT_EQ(n.params().ord, 5);  // at most the Initiator IRD
  }
}

TEST(MpaNegotiator, PeerToPeerInitiatorNeedsAnAdvertisedRtr) {
  NegotiatorConfig c = Initiator();
  c.peer_to_peer = true;
  c.rtr_types = {false, true, false};  // Write only
  // RFC 6581 9.2: A=1 but only Read advertised: "not able to generate any
  // of the responder-supported RTR indications" -> TERM code 7.
  ExpectTerminate(FeedInitiator(c, Frame(kRep, 0x1002, Word(0x8001, 0x4001))).events,
                  MpaError::kNoMatchingRtr, StartupFailure::kNoMatchingRtr);
  // Write advertised but A=0: the Responder broke "MUST set Control Flag A
  // to 1"; no compatible connection model -> TERM code 7; B/C/D ignored.
  ExpectTerminate(FeedInitiator(c, Frame(kRep, 0x1002, Word(0x0001, 0x8001))).events,
                  MpaError::kNoMatchingRtr, StartupFailure::kNoMatchingRtr);
  EXPECT_EQ(TerminateCauseFromMpaError(MpaError::kNoMatchingRtr), (TerminateCause{2, 0, 7}));
  // Advertised.
  const InitiatorRun r = FeedInitiator(c, Frame(kRep, 0x1002, Word(0x8001, 0x8001)));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(r.n->params().rtr, RtrType::kWrite);
  EXPECT_EQ(r.n->params().first_send, FirstSendRule::kRtrFpduFirst);
  // Several advertised: the choice is ours (RFC 6581 1.1).
  c.rtr_types = {true, true, true};
  const InitiatorRun all = FeedInitiator(c, Frame(kRep, 0x1002, Word(0xC001, 0xC001)));
  ASSERT_EQ(all.events.size(), 1u);
  EXPECT_EQ(all.n->params().rtr, RtrType::kWrite);
  EXPECT_EQ(all.n->params().rtr_types, (RtrTypeSet{true, true, true}));
}

TEST(MpaNegotiator, ReadRtrNeedsAnOrdSlot) {
  NegotiatorConfig c = Initiator();
  c.peer_to_peer = true;
  c.rtr_types = {false, false, true};  // Read only
  // Responder IRD 0 leaves us ORD 0: the Read RTR cannot be sent.
  ExpectTerminate(FeedInitiator(c, Frame(kRep, 0x1002, Word(0x8000, 0x4001))).events,
                  MpaError::kNoMatchingRtr, StartupFailure::kNoMatchingRtr);
  // With ORD 0 configured, Read is not even offered: nothing left to offer.
  c.ord = 0;
  MpaNegotiator n(c);
  EXPECT_EQ(n.Start(T(0)), NegotiatorStatus::kInvalidConfig);
  EXPECT_TRUE(Pending(n).empty());
  EXPECT_EQ(n.state(), NegotiatorState::kIdle);
}

TEST(MpaNegotiator, PeerToPeerBitsIgnoredWhenNotRequested) {
  // A = 1 answering our A = 0 breaks RFC 6581 9.2; no RTR type was
  // negotiated, so the client-server model stands.
  const InitiatorRun r = FeedInitiator(Initiator(), Frame(kRep, 0x1002, Word(0x8001, 0x8001)));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kEstablished);
  EXPECT_FALSE(r.n->params().peer_to_peer);
  EXPECT_EQ(r.n->params().rtr, RtrType::kNone);
  EXPECT_EQ(r.n->params().rtr_types, (RtrTypeSet{false, false, false}));
  EXPECT_EQ(r.n->params().first_send, FirstSendRule::kMayNow);
}

TEST(MpaNegotiator, InitiatorRefusesMarkersItCannotSend) {
  NegotiatorConfig c = Initiator(MpaDialect::kV1);
  c.markers_can_send = false;
  ExpectFailed(FeedInitiator(c, Frame(kRep, 0x8001)).events, MpaError::kInvalidStartupFrame,
               StartupFailure::kMarkersRefused);
}

TEST(MpaNegotiator, InitiatorUsesCrcWhenOnlyItsRequestHadC) {
  // RFC 5044 7.1.1: '1' in either frame means CRC both ways.
  NegotiatorConfig c = Initiator(MpaDialect::kV1);
  c.crc = CrcPolicy::kRequire;
  const InitiatorRun r = FeedInitiator(c, Frame(kRep, 0x0001));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_TRUE(r.n->params().crc);
}

TEST(MpaNegotiator, PeerRejectKeepsPrivateDataAndLeavesTcpToTheUlp) {
  const InitiatorRun r =
      FeedInitiator(Initiator(MpaDialect::kV1), Frame(kRep, 0x2001, Ascii("busy")));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kRejected);
  EXPECT_TRUE(r.events[0].by_peer);
  EXPECT_EQ(r.events[0].error, MpaError::kNone);
  EXPECT_EQ(r.n->state(), NegotiatorState::kRejected);
  EXPECT_EQ(r.n->params().peer_private_data, Ascii("busy"));
  // A v2 reject carries the IRD/ORD word; the ULP sees only what follows.
  const InitiatorRun v2 =
      FeedInitiator(Initiator(), Frame(kRep, 0x3002, Cat({Word(0, 0), Ascii("full")})));
  ASSERT_EQ(v2.events.size(), 1u);
  EXPECT_EQ(v2.events[0].type, NegotiatorEventType::kRejected);
  EXPECT_EQ(v2.n->params().peer_private_data, Ascii("full"));
  // RFC 6581 9.1: the Responder's IRD/ORD reach the ULP for rejects too,
  // e.g. the ORD it requires.
  const InitiatorRun need = FeedInitiator(Initiator(), Frame(kRep, 0x3002, Word(0, 16)));
  ASSERT_EQ(need.events.size(), 1u);
  EXPECT_EQ(need.events[0].type, NegotiatorEventType::kRejected);
  EXPECT_EQ(need.n->params().peer_ird_ord, (IrdOrdWord{0, 16, false, false, false, false}));
}

TEST(MpaNegotiator, InitiatorInitiatorIsDetected) {
  // RFC 5044 7.1.2 rule 8: both ends send a Request; each sees a Request.
  MpaNegotiator a(Initiator()), b(Initiator(MpaDialect::kV1));
  ASSERT_EQ(a.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(b.Start(T(0)), NegotiatorStatus::kOk);
  const Bytes from_a = Pending(a), from_b = Pending(b);
  EXPECT_EQ(b.Feed(T(1), from_a), from_a.size());
  EXPECT_EQ(a.Feed(T(1), from_b), from_b.size());
  ExpectFailed(DrainEvents(a), MpaError::kInvalidStartupFrame, StartupFailure::kInitiatorInitiator);
  ExpectFailed(DrainEvents(b), MpaError::kInvalidStartupFrame, StartupFailure::kInitiatorInitiator);
}

TEST(MpaNegotiator, ResponderResponderTimesOut) {
  // Neither sends; both wait for a Request until the deadline (rule 8).
  MpaNegotiator a(Responder()), b(Responder(MpaDialect::kV1));
  ASSERT_EQ(a.Start(T(100)), NegotiatorStatus::kOk);
  ASSERT_EQ(b.Start(T(100)), NegotiatorStatus::kOk);
  EXPECT_TRUE(Pending(a).empty());
  EXPECT_TRUE(Pending(b).empty());
  EXPECT_EQ(a.Deadline(), T(1100));
  a.OnTime(T(1099));
  b.OnTime(T(1099));
  EXPECT_TRUE(DrainEvents(a).empty());
  EXPECT_EQ(a.state(), NegotiatorState::kAwaitingRequest);
  a.OnTime(T(1100));
  b.OnTime(T(5000));
  ExpectFailed(DrainEvents(a), MpaError::kConnectionLost, StartupFailure::kTimeout);
  ExpectFailed(DrainEvents(b), MpaError::kConnectionLost, StartupFailure::kTimeout);
  EXPECT_EQ(a.Deadline(), std::nullopt);
}

TEST(MpaNegotiator, InitiatorReplyTimeoutAtTheDeadlineExactly) {
  MpaNegotiator n(Initiator());
  ASSERT_EQ(n.Start(T(50)), NegotiatorStatus::kOk);
  n.OnTime(T(1049));
  EXPECT_TRUE(DrainEvents(n).empty());
  n.OnTime(T(1050));
  ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kTimeout);
  n.OnTime(T(9999));  // nothing after a terminal event
  EXPECT_TRUE(DrainEvents(n).empty());
}

TEST(MpaNegotiator, ReplyArrivingAfterTheDeadlineIsTooLate) {
  MpaNegotiator n(Initiator(MpaDialect::kV1));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(n.Feed(T(1000), Frame(kRep, 0x0001)), 0u);
  ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kTimeout);
}

TEST(MpaNegotiator, PartialReplyThenTimeout) {
  MpaNegotiator n(Initiator(MpaDialect::kV1));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  const Bytes reply = Frame(kRep, 0x0001, Ascii("xyz"));
  EXPECT_EQ(n.Feed(T(10), ByteSpan(reply).first(21)), 21u);
  EXPECT_TRUE(DrainEvents(n).empty());
  n.OnTime(T(1000));
  ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kTimeout);
  EXPECT_EQ(n.Feed(T(1001), ByteSpan(reply).subspan(21)), 0u);
}

// ---------------------------------------------------------------------------
// Responder against crafted Requests.

struct ResponderRun {
  std::unique_ptr<MpaNegotiator> n;
  std::size_t consumed = 0;
  std::vector<NegotiatorEvent> events;
};

ResponderRun FeedResponder(const NegotiatorConfig& c, const Bytes& bytes) {
  ResponderRun r;
  r.n = std::make_unique<MpaNegotiator>(c);
  EXPECT_EQ(r.n->Start(T(0)), NegotiatorStatus::kOk);
  r.consumed = r.n->Feed(T(10), bytes);
  r.events = DrainEvents(*r.n);
  return r;
}

TEST(MpaNegotiator, ResponderAnswersLWithLWhenItAccepts) {
  const Bytes siw_gso_request =
      Cat({Ascii(kReq), {0x18, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01}});
  struct Case {
    bool accept_large;
    const Bytes* request;
    std::uint16_t reply_flags;
    bool agreed;
  };
  const std::vector<Case> cases = {
      {true, &siw_gso_request, 0x1802, true},
      {false, &siw_gso_request, 0x1002, false},
      {true, &kSiwRequest, 0x1002, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.reply_flags) + (c.accept_large ? " accepting" : ""));
    NegotiatorConfig config = Responder();
    config.large_fpdus = c.accept_large;
    MpaNegotiator n(config);
    ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
    EXPECT_EQ(n.Feed(T(5), *c.request), 24u);
    ASSERT_EQ(DrainEvents(n).size(), 1u);
    EXPECT_EQ(n.offer().large_fpdus, c.request == &siw_gso_request);
    EXPECT_EQ(n.offer().reserved_bits, 0);
    ASSERT_EQ(n.Accept(T(6), {}, 16, 16), NegotiatorStatus::kOk);
    EXPECT_EQ(Pending(n), Frame(kRep, c.reply_flags, Word(1, 1)));
    EXPECT_EQ(n.params().large_fpdus, c.agreed);
  }
  // v1 and the S-bit dialect: the same answer in Rev 1.
  for (const std::uint16_t req : {std::uint16_t{0x0801}, std::uint16_t{0x1801}}) {
    NegotiatorConfig config = Responder();
    config.large_fpdus = true;
    ResponderRun r = FeedResponder(config, Frame(kReq, req));
    ASSERT_EQ(r.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
    EXPECT_EQ(Pending(*r.n), Frame(kRep, req));
    EXPECT_TRUE(r.n->params().large_fpdus);
  }
}

TEST(MpaNegotiator, RejectingReplyCarriesNoL) {
  NegotiatorConfig config = Responder();
  config.large_fpdus = true;
  ResponderRun r = FeedResponder(config, Frame(kReq, 0x1802, Word(1, 1)));
  ASSERT_EQ(r.n->Reject({}), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x3002, Word(0, 0)));  // R, enhanced, Rev 2
  EXPECT_FALSE(r.n->params().large_fpdus);
  // A rejecting Reply with L does not make an agreement either.
  NegotiatorConfig ini = Initiator();
  ini.large_fpdus = true;
  const InitiatorRun i = FeedInitiator(ini, Frame(kRep, 0x3802, Word(0, 0)));
  ASSERT_EQ(i.events.size(), 1u);
  EXPECT_EQ(i.events[0].type, NegotiatorEventType::kRejected);
  EXPECT_FALSE(i.n->params().large_fpdus);
}

TEST(MpaNegotiator, UnenhancedResponderClosesOnAnEnhancedRequest) {
  // RFC 6581 10: "If the responder receives an enhanced MPA message and it
  // does not support enhanced RDMA connection establishment, it MUST close
  // the TCP connection and exit MPA." No Rev 1 Reply.
  for (MpaDialect d : {MpaDialect::kV1, MpaDialect::kV1Rtr}) {
    ResponderRun r =
        FeedResponder(Responder(d), Frame(kReq, 0x1002, Cat({Word(5, 6), Ascii("app")})));
    EXPECT_EQ(r.consumed, 27u);
    ExpectFailed(r.events, MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedUnsupported);
    EXPECT_FALSE(r.events[0].send_terminate);
    EXPECT_EQ(r.n->state(), NegotiatorState::kFailed);
    EXPECT_TRUE(Pending(*r.n).empty());
    EXPECT_EQ(r.n->offer().dialect, MpaDialect::kV2);
    EXPECT_EQ(r.n->offer().private_data, Ascii("app"));  // the word is not the ULP's
    EXPECT_EQ(r.n->Accept(T(11), {}, 7, 7), NegotiatorStatus::kWrongState);
  }
}

TEST(MpaNegotiator, EnhancedResponderAnswersUnenhancedRequestsUnenhanced) {
  // RFC 6581 6 and 10: a v2 host MUST keep accepting Rev 1 Requests and
  // answers an unenhanced Request with an unenhanced Reply.
  ResponderRun r = FeedResponder(Responder(), Frame(kReq, 0x4001, Ascii("v1")));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kRequestReceived);
  EXPECT_EQ(r.n->offer().answer_dialect, MpaDialect::kV1);
  EXPECT_EQ(r.n->offer().ird_ord, std::nullopt);
  ASSERT_EQ(r.n->Accept(T(11), Ascii("ok"), 7, 3), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x4001, Ascii("ok")));  // C echoed, Rev 1, no word
  EXPECT_FALSE(r.n->params().ird_ord_exchanged);
  EXPECT_EQ(r.n->params().ird, 7);
  EXPECT_EQ(r.n->params().ord, 3);
}

TEST(MpaNegotiator, Rev2RequestWithoutEnhancedBit) {
  // v1 semantics under Rev 2: a v2 Responder keeps Rev 2, an older one says Rev 1.
  ResponderRun v2 = FeedResponder(Responder(), Frame(kReq, 0x0002, Ascii("p")));
  ASSERT_EQ(v2.events.size(), 1u);
  EXPECT_EQ(v2.n->offer().dialect, MpaDialect::kV1);
  ASSERT_EQ(v2.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*v2.n), Frame(kRep, 0x0002));
  EXPECT_EQ(v2.n->params().revision, 2);
  EXPECT_EQ(v2.n->params().dialect, MpaDialect::kV1);

  ResponderRun v1 = FeedResponder(Responder(MpaDialect::kV1Rtr), Frame(kReq, 0x0002));
  ASSERT_EQ(v1.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*v1.n), Frame(kRep, 0x0001));
}

TEST(MpaNegotiator, ResponderIgnoresReservedBitsAndRInARequest) {
  ResponderRun r = FeedResponder(Responder(MpaDialect::kV1), Frame(kReq, 0x2F01));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kRequestReceived);
  EXPECT_EQ(r.n->offer().reserved_bits, 0x07);
  EXPECT_TRUE(r.n->offer().large_fpdus);  // 0x0800 is L
  ASSERT_EQ(r.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x0001));  // Res = 0, and no L: not accepting it
  EXPECT_FALSE(r.n->params().large_fpdus);
}

TEST(MpaNegotiator, ResponderRefusesMarkersItCannotSend) {
  NegotiatorConfig c = Responder();
  c.markers_can_send = false;
  ResponderRun r = FeedResponder(c, Frame(kReq, 0x9002, Word(1, 1)));  // M=1
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kRejected);
  EXPECT_FALSE(r.events[0].by_peer);
  EXPECT_EQ(r.events[0].failure, StartupFailure::kMarkersRefused);
  EXPECT_EQ(r.n->state(), NegotiatorState::kRejected);
  // What siw does too: R set, IRD/ORD 0.
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x3002, Word(0, 0)));
  EXPECT_EQ(r.n->Accept(T(12), {}, 1, 1), NegotiatorStatus::kWrongState);
  // A rejecting Reply to a peer-to-peer Request still echoes A and flags the
  // types this end supports (RFC 6581 9.2 speaks of the "MPA reply message").
  ResponderRun p2p = FeedResponder(c, Frame(kReq, 0x9002, Word(0xC001, 0xC001)));
  ASSERT_EQ(p2p.events.size(), 1u);
  EXPECT_EQ(p2p.events[0].failure, StartupFailure::kMarkersRefused);
  EXPECT_EQ(Pending(*p2p.n), Frame(kRep, 0x3002, Word(0x8000, 0xC000)));  // Write+Read, IRD/ORD 0
}

TEST(MpaNegotiator, ConsumerRejectSendsPrivateData) {
  Scenario s;
  s.ini = Initiator(MpaDialect::kV1);
  s.resp = Responder(MpaDialect::kV1);
  s.reject = true;
  s.reply_pd = Ascii("go away");
  const Outcome o = RunAllWays(s);
  EXPECT_EQ(o.resp->sent, Frame(kRep, 0x2001, Ascii("go away")));
  EXPECT_EQ(o.resp->n.state(), NegotiatorState::kRejected);
  ASSERT_EQ(o.resp->events.size(), 1u);  // kRequestReceived only: Reject() raises nothing
  EXPECT_EQ(o.ini->n.state(), NegotiatorState::kRejected);
  ASSERT_EQ(o.ini->events.size(), 1u);
  EXPECT_EQ(o.ini->events[0].type, NegotiatorEventType::kRejected);
  EXPECT_TRUE(o.ini->events[0].by_peer);
  EXPECT_EQ(o.ini->n.params().peer_private_data, Ascii("go away"));
}

TEST(MpaNegotiator, V2ConsumerRejectCarriesAZeroWord) {
  Scenario s;
  s.reject = true;
  s.reply_pd = Ascii("no");
  const Outcome o = RunAllWays(s);
  EXPECT_EQ(o.resp->sent, Frame(kRep, 0x3002, Cat({Word(0, 0), Ascii("no")})));
  EXPECT_EQ(o.ini->n.params().peer_private_data, Ascii("no"));
}

TEST(MpaNegotiator, V2ConsumerRejectStatesTheRequiredOrd) {
  // RFC 6581 9.1: "The responder MAY reject the connection request if the
  // initiator IRD is not sufficient for the ULP-required ORD and specify the
  // required ORD in the MPA Reject Frame responder ORD."
  Scenario s;
  s.ini.ird = 2;
  s.reject = true;
  s.reject_ird = 4;
  s.reject_ord = 16;
  const Outcome o = RunAllWays(s);
  // clang-format off
  EXPECT_EQ(o.resp->sent, Cat({Ascii(kRep),
                               {0x30, 0x02,     // R=1 S=1 | Rev 2
                                0x00, 0x04,     // PD_Length 4
                                0x00, 0x04,     // A=0 B=0 IRD 4
                                0x00, 0x10}}));  // C=0 D=0 ORD 16: what the ULP needs
  // clang-format on
  EXPECT_EQ(o.ini->n.state(), NegotiatorState::kRejected);
  EXPECT_EQ(o.ini->n.params().peer_ird_ord, (IrdOrdWord{4, 16, false, false, false, false}));

  MpaNegotiator r(Responder());
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(r.Feed(T(1), kSiwRequest), 24u);
  EXPECT_EQ(r.Reject({}, 0x4000, 0), NegotiatorStatus::kInvalidArgument);
  EXPECT_EQ(r.Reject({}, 0, 0x4000), NegotiatorStatus::kInvalidArgument);
  EXPECT_TRUE(Pending(r).empty());
  EXPECT_EQ(r.state(), NegotiatorState::kAwaitingConsumer);
}

TEST(MpaNegotiator, ResponderGotAReplyOrRtr) {
  ExpectFailed(FeedResponder(Responder(), Frame(kRep, 0x0001)).events,
               MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame);
  ExpectFailed(FeedResponder(Responder(), Frame(kRtr, 0x0001)).events,
               MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame);
  ExpectFailed(FeedInitiator(Initiator(), Frame(kRtr, 0x0001)).events,
               MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame);
}

struct MalformedCase {
  Bytes bytes;
  StartupFailure failure;
};

TEST(MpaNegotiator, MalformedFramesCloseTheConnection) {
  // clang-format off
  const std::vector<MalformedCase> cases = {
      {Ascii("GET / HTTP/1.1\r\n\r\n"), StartupFailure::kBadKey},
      {Frame("MPA ID Req Frami", 0x0001), StartupFailure::kBadKey},
      {Frame(kReq, 0x0000), StartupFailure::kBadRevision},                 // Rev 0
      {Frame(kReq, 0x0003), StartupFailure::kBadRevision},                 // Rev 3
      {Frame(kReq, 0x0001, {}, 513), StartupFailure::kPrivateDataTooLong},
      {Frame(kReq, 0x1002, {0x00, 0x01}), StartupFailure::kMissingIrdOrd},  // PD_Length 2
  };
  // clang-format on
  for (const MalformedCase& c : cases) {
    for (const NegotiatorConfig& cfg : {Responder(), Initiator()}) {
      ResponderRun r;
      r.n = std::make_unique<MpaNegotiator>(cfg);
      ASSERT_EQ(r.n->Start(T(0)), NegotiatorStatus::kOk);
      r.n->ConsumeOutput(Pending(*r.n).size());
      r.n->Feed(T(1), c.bytes);
      // Framing is unknown: close without a Terminate.
      ExpectFailed(DrainEvents(*r.n), MpaError::kInvalidStartupFrame, c.failure);
      EXPECT_EQ(r.n->state(), NegotiatorState::kFailed);
      EXPECT_TRUE(Pending(*r.n).empty());
      EXPECT_EQ(r.n->Feed(T(2), c.bytes), 0u);  // dead: consumes nothing more
      EXPECT_TRUE(DrainEvents(*r.n).empty());
    }
  }
}

TEST(MpaNegotiator, MaximumPrivateDataBothWays) {
  Scenario s;
  s.ini = Initiator(MpaDialect::kV1);
  s.resp = Responder(MpaDialect::kV1);
  s.ini_pd = Bytes(512, 0xA5);
  s.reply_pd = Bytes(512, 0x5A);
  const Outcome o = RunAllWays(s);
  EXPECT_EQ(o.resp->n.offer().private_data, Bytes(512, 0xA5));
  EXPECT_EQ(o.ini->n.params().peer_private_data, Bytes(512, 0x5A));
  EXPECT_EQ(o.ini->n.state(), NegotiatorState::kFullOperation);
}

// ---------------------------------------------------------------------------
// Octets after a frame belong to the FPDU stream.

const Bytes kFpduStart = {0x00, 0x12, 0x41, 0x43, 0x00, 0x00};

TEST(MpaNegotiator, OctetsAfterTheReplyAreNotConsumed) {
  const Bytes reply = Frame(kRep, 0x1002, Cat({Word(1, 1), Ascii("pd")}));
  const Bytes stream = Cat({reply, kFpduStart});
  // Whole.
  InitiatorRun whole = FeedInitiator(Initiator(), stream);
  EXPECT_EQ(whole.consumed, reply.size());
  ASSERT_EQ(whole.events.size(), 1u);
  EXPECT_EQ(whole.events[0].type, NegotiatorEventType::kEstablished);
  // Byte at a time: every octet after the frame is refused.
  MpaNegotiator n(Initiator());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  std::size_t total = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    const std::size_t used = n.Feed(T(1), ByteSpan(stream).subspan(i, 1));
    EXPECT_EQ(used, i < reply.size() ? 1u : 0u) << "octet " << i;
    total += used;
  }
  EXPECT_EQ(total, reply.size());
}

TEST(MpaNegotiator, OctetsAfterTheRequestWaitForTheConsumer) {
  MpaNegotiator n(Responder(MpaDialect::kV1));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  const Bytes req = Frame(kReq, 0x0001, Ascii("r"));
  EXPECT_EQ(n.Feed(T(1), Cat({req, kFpduStart})), req.size());
  EXPECT_EQ(n.state(), NegotiatorState::kAwaitingConsumer);
  EXPECT_EQ(n.Feed(T(2), kFpduStart), 0u);  // nothing is expected now
  ASSERT_EQ(n.Accept(T(3), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(n.Feed(T(4), kFpduStart), 0u);  // established: FPDUs are not ours
}

TEST(MpaNegotiator, SBitResponderWaitsForRtrAndLeavesTheFpdus) {
  MpaNegotiator n(Responder(MpaDialect::kV1Rtr));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x5001)), 20u);  // C=1 S=1
  ASSERT_EQ(DrainEvents(n).size(), 1u);
  ASSERT_EQ(n.Accept(T(2), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(n), Frame(kRep, 0x5001));  // C echoed, S: waiting for Rtr
  EXPECT_TRUE(DrainEvents(n).empty());         // not established before the Rtr frame
  EXPECT_EQ(n.state(), NegotiatorState::kAwaitingRtr);
  EXPECT_EQ(n.Deadline(), T(1002));
  const Bytes rtr = Frame(kRtr, 0x4001);
  EXPECT_EQ(n.Feed(T(3), Cat({rtr, kFpduStart})), 20u);
  const auto ev = DrainEvents(n);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kEstablished);
  EXPECT_EQ(n.state(), NegotiatorState::kFullOperation);
  EXPECT_EQ(n.params().first_send, FirstSendRule::kMayNow);
  EXPECT_EQ(n.Deadline(), std::nullopt);
}

TEST(MpaNegotiator, RtrFrameMustCarryTheRepliesC) {
  MpaNegotiator n(Responder(MpaDialect::kV1Rtr));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1001)), 20u);  // C=0 S=1
  ASSERT_EQ(DrainEvents(n).size(), 1u);
  ASSERT_EQ(n.Accept(T(2), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(n.Feed(T(3), Frame(kRtr, 0x4001)), 20u);  // C=1: not the Reply's
  ExpectFailed(DrainEvents(n), MpaError::kInvalidStartupFrame, StartupFailure::kRtrCrcMismatch);
}

TEST(MpaNegotiator, SBitResponderGetsSomethingElseThanRtr) {
  MpaNegotiator n(Responder(MpaDialect::kV2));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1001)), 20u);
  ASSERT_EQ(DrainEvents(n).size(), 1u);
  ASSERT_EQ(n.Accept(T(2), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(n.Feed(T(3), Frame(kReq, 0x1001)), 20u);
  ExpectFailed(DrainEvents(n), MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame);
}

TEST(MpaNegotiator, RtrTimeout) {
  MpaNegotiator n(Responder(MpaDialect::kV1Rtr));
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x1001)), 20u);
  ASSERT_EQ(DrainEvents(n).size(), 1u);
  ASSERT_EQ(n.Accept(T(300), {}, 1, 1), NegotiatorStatus::kOk);
  n.OnTime(T(1299));
  EXPECT_TRUE(DrainEvents(n).empty());
  n.OnTime(T(1300));
  ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kTimeout);
}

TEST(MpaNegotiator, FirstFpduTimeoutAndItsCancellation) {
  for (bool fpdu_arrives : {false, true}) {
    MpaNegotiator n(Responder(MpaDialect::kV1));
    ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
    ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x0001)), 20u);
    ASSERT_EQ(n.Accept(T(100), {}, 1, 1), NegotiatorStatus::kOk);
    ASSERT_EQ(DrainEvents(n).size(), 2u);  // request received, established
    EXPECT_EQ(n.Deadline(), T(600));
    if (fpdu_arrives) {
      n.NoteFirstFpduReceived();
      EXPECT_EQ(n.state(), NegotiatorState::kFullOperation);
      EXPECT_EQ(n.Deadline(), std::nullopt);
      n.OnTime(T(100000));
      EXPECT_TRUE(DrainEvents(n).empty());
    } else {
      n.OnTime(T(599));
      EXPECT_TRUE(DrainEvents(n).empty());
      n.OnTime(T(600));
      ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kFirstFpduTimeout);
    }
  }
  NegotiatorConfig c = Responder(MpaDialect::kV1);
  c.first_fpdu_timeout = T(0);  // disabled
  MpaNegotiator n(c);
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(n.Feed(T(1), Frame(kReq, 0x0001)), 20u);
  ASSERT_EQ(n.Accept(T(2), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(n.state(), NegotiatorState::kAwaitingFirstFpdu);
  EXPECT_EQ(n.Deadline(), std::nullopt);
}

// ---------------------------------------------------------------------------
// Consumer API errors change nothing.

TEST(MpaNegotiator, PrivateDataOverTheLimitIsRefusedLocally) {
  for (MpaDialect d : {MpaDialect::kV1, MpaDialect::kV1Rtr}) {
    MpaNegotiator n(Initiator(d));
    EXPECT_EQ(n.Start(T(0), Bytes(513, 1)), NegotiatorStatus::kPrivateDataTooLong);
    EXPECT_EQ(n.state(), NegotiatorState::kIdle);
    EXPECT_TRUE(Pending(n).empty());
    EXPECT_EQ(n.Start(T(0), Bytes(512, 1)), NegotiatorStatus::kOk);
  }
  // v2: the IRD/ORD word takes 4 of the 512 octets.
  MpaNegotiator n(Initiator());
  EXPECT_EQ(n.Start(T(0), Bytes(509, 1)), NegotiatorStatus::kPrivateDataTooLong);
  EXPECT_TRUE(Pending(n).empty());
  EXPECT_EQ(n.Start(T(0), Bytes(508, 1)), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(n).size(), 532u);

  MpaNegotiator r(Responder());
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(r.Feed(T(1), kSiwRequest), 24u);
  EXPECT_EQ(r.Accept(T(2), Bytes(509, 1), 1, 1), NegotiatorStatus::kPrivateDataTooLong);
  EXPECT_EQ(r.Reject(Bytes(509, 1)), NegotiatorStatus::kPrivateDataTooLong);
  EXPECT_EQ(r.state(), NegotiatorState::kAwaitingConsumer);
  EXPECT_TRUE(Pending(r).empty());
  EXPECT_EQ(r.Accept(T(2), Bytes(508, 1), 1, 1), NegotiatorStatus::kOk);
}

TEST(MpaNegotiator, CallsInTheWrongStateOrWithBadArguments) {
  MpaNegotiator i(Initiator());
  EXPECT_EQ(i.Accept(T(0), {}, 1, 1), NegotiatorStatus::kWrongState);
  EXPECT_EQ(i.Reject({}), NegotiatorStatus::kWrongState);
  ASSERT_EQ(i.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(i.Start(T(0)), NegotiatorStatus::kWrongState);
  EXPECT_EQ(i.Accept(T(0), {}, 1, 1), NegotiatorStatus::kWrongState);

  MpaNegotiator r(Responder());
  EXPECT_EQ(r.Feed(T(0), kSiwRequest), 0u);  // not started
  EXPECT_EQ(r.Start(T(0), Ascii("x")), NegotiatorStatus::kInvalidArgument);
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  EXPECT_EQ(r.Accept(T(0), {}, 1, 1), NegotiatorStatus::kWrongState);
  ASSERT_EQ(r.Feed(T(1), kSiwRequest), 24u);
  EXPECT_EQ(r.Accept(T(1), {}, 0x4000, 1), NegotiatorStatus::kInvalidArgument);
  EXPECT_EQ(r.Accept(T(1), {}, 1, 0x4000), NegotiatorStatus::kInvalidArgument);
  EXPECT_EQ(r.state(), NegotiatorState::kAwaitingConsumer);

  NegotiatorConfig bad = Initiator();
  bad.ird = 0x4000;
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kInvalidConfig);
  bad = Initiator();
  bad.startup_timeout = T(0);
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kInvalidConfig);
  bad = Initiator();
  bad.first_fpdu_timeout = T(-1);
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kInvalidConfig);
  bad = Initiator();
  bad.dialect = static_cast<MpaDialect>(9);
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kInvalidConfig);
  bad = Initiator();
  bad.peer_to_peer = true;
  bad.rtr_types = {false, false, false};
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kInvalidConfig);
  // RFC 6581 9.2: "The responder MUST support at least one RTR indication
  // option if it supports Enhanced RDMA connection establishment."
  bad = Responder();
  bad.rtr_types = {false, false, false};
  MpaNegotiator no_rtr(bad);
  EXPECT_EQ(no_rtr.Start(T(0)), NegotiatorStatus::kInvalidConfig);
  EXPECT_EQ(no_rtr.state(), NegotiatorState::kIdle);
  bad.dialect = MpaDialect::kV1Rtr;  // no enhanced establishment: no such duty
  EXPECT_EQ(MpaNegotiator(bad).Start(T(0)), NegotiatorStatus::kOk);
}

TEST(MpaNegotiator, ReadRtrGrantNeedsAResponderIrd) {
  MpaNegotiator r(Responder());
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(r.Feed(T(1), Frame(kReq, 0x1002, Word(0x8001, 0x4001))), 24u);  // p2p, Read, ORD 1
  EXPECT_EQ(r.offer().rtr_types, (RtrTypeSet{false, false, true}));
  // Read is the only type to advertise and IRD 0 cannot serve it.
  EXPECT_EQ(r.Accept(T(2), {}, 0, 1), NegotiatorStatus::kInvalidArgument);
  EXPECT_TRUE(Pending(r).empty());
  ASSERT_EQ(r.Accept(T(2), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(r), Frame(kRep, 0x1002, Word(0x8001, 0x4001)));
}

TEST(MpaNegotiator, ReadRtrDroppedWhenIrdIsZeroButOthersRemain) {
  MpaNegotiator r(Responder());
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(r.Feed(T(1), Frame(kReq, 0x1002, Word(0x8001, 0xC001))), 24u);  // Write + Read
  EXPECT_EQ(r.offer().rtr_types, (RtrTypeSet{false, true, true}));
  ASSERT_EQ(r.Accept(T(2), {}, 0, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(r), Frame(kRep, 0x1002, Word(0x8000, 0x8001)));  // A, IRD 0 | C, ORD 1
  EXPECT_EQ(r.params().rtr_types, (RtrTypeSet{false, true, false}));
}

TEST(MpaNegotiator, ResponderRaisesIrdToCarryAReadRtr) {
  // RFC 6581 9.1: "if the initiator ORD is 0 ... and the responder supports
  // use of a zero-length RDMA Read RTR indication, then the responder IRD
  // can be set to 1."
  MpaNegotiator r(Responder());
  ASSERT_EQ(r.Start(T(0)), NegotiatorStatus::kOk);
  ASSERT_EQ(r.Feed(T(1), Frame(kReq, 0x1002, Word(0x8001, 0x4000))), 24u);  // Read, ORD 0
  const auto ev = DrainEvents(r);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, NegotiatorEventType::kRequestReceived);
  ASSERT_EQ(r.Accept(T(2), {}, 4, 4), NegotiatorStatus::kOk);
  // clang-format off
  EXPECT_EQ(Pending(r), Cat({Ascii(kRep),
                             {0x10, 0x02,     // S | Rev 2
                              0x00, 0x04,     // PD_Length 4
                              0x80, 0x01,     // A=1 B=0 IRD 1 (raised from min(4, 0))
                              0x40, 0x01}}));  // C=0 D=1 ORD min(4, peer IRD 1)
  // clang-format on
  EXPECT_EQ(r.params().ird, 1);
  EXPECT_EQ(r.params().ord, 1);
}

TEST(MpaNegotiator, ResponderAdvertisesItsOwnTypesWhenNoOfferedOneFits) {
  // RFC 6581 9.2: "If the responder does not support any of the
  // initiator-specified RTR indication options, then the responder MUST set
  // at least one RTR indication type option it supports." No reject.
  NegotiatorConfig c = Responder();
  c.rtr_types = {false, true, true};  // Write, Read
  ResponderRun r = FeedResponder(c, Frame(kReq, 0x1002, Word(0xC001, 0x0001)));  // Send only
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, NegotiatorEventType::kRequestReceived);
  ASSERT_EQ(r.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x1002, Word(0x8001, 0xC001)));
  EXPECT_TRUE(r.n->params().peer_to_peer);
  EXPECT_EQ(r.n->params().rtr, RtrType::kNone);
}

TEST(MpaNegotiator, ResponderFlagsEveryOfferedTypeItSupports) {
  // RFC 6581 9.2: "For each initiator-supported RTR indication option, the
  // responder SHOULD set the corresponding Control Flag if the responder
  // can support that option"; the Initiator chooses (1.1).
  NegotiatorConfig c = Responder();
  c.rtr_types = {true, true, true};
  ResponderRun r = FeedResponder(c, Frame(kReq, 0x1002, Word(0xC002, 0xC003)));
  ASSERT_EQ(r.n->Accept(T(11), {}, 8, 8), NegotiatorStatus::kOk);
  // clang-format off
  EXPECT_EQ(Pending(*r.n), Cat({Ascii(kRep),
                                {0x10, 0x02,     // S | Rev 2
                                 0x00, 0x04,     // PD_Length 4
                                 0xC0, 0x03,     // A=1 B=1 IRD min(8, 3)
                                 0xC0, 0x02}}));  // C=1 D=1 ORD min(8, 2)
  // clang-format on
  EXPECT_EQ(r.n->params().rtr_types, (RtrTypeSet{true, true, true}));
}

TEST(MpaNegotiator, ResponderIgnoresRtrFlagsWithoutA) {
  // RFC 6581 9.2: "On reception, if Control Flag A is set to 0, then
  // Control Flags B, C, and D MUST be ignored"; the Reply keeps A = 0 and
  // so B, C, D = 0.
  ResponderRun r = FeedResponder(Responder(), Frame(kReq, 0x1002, Word(0x4001, 0xC001)));
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_FALSE(r.n->offer().peer_to_peer);
  ASSERT_EQ(r.n->Accept(T(11), {}, 1, 1), NegotiatorStatus::kOk);
  EXPECT_EQ(Pending(*r.n), Frame(kRep, 0x1002, Word(0x0001, 0x0001)));
  EXPECT_FALSE(r.n->params().peer_to_peer);
}

TEST(MpaNegotiator, Rfc6581ErrorCodes) {
  // RFC 6581 8: Layer 0x2 LLP, Error Type 0x0 MPA, codes 5, 6, 7.
  EXPECT_EQ(static_cast<int>(MpaError::kLocalCatastrophic), 5);
  EXPECT_EQ(static_cast<int>(MpaError::kInsufficientIrd), 6);
  EXPECT_EQ(static_cast<int>(MpaError::kNoMatchingRtr), 7);
  EXPECT_EQ(TerminateCauseFromMpaError(MpaError::kLocalCatastrophic), (TerminateCause{2, 0, 5}));
  EXPECT_EQ(MpaErrorName(MpaError::kInsufficientIrd), "insufficient IRD resources");
  EXPECT_EQ(MpaErrorName(MpaError::kNoMatchingRtr), "no matching RTR option");
  EXPECT_EQ(MpaErrorName(MpaError::kLocalCatastrophic), "local catastrophic error");
}

TEST(MpaNegotiator, ConnectionClosedDuringStartup) {
  MpaNegotiator n(Initiator());
  ASSERT_EQ(n.Start(T(0)), NegotiatorStatus::kOk);
  n.OnConnectionClosed();
  ExpectFailed(DrainEvents(n), MpaError::kConnectionLost, StartupFailure::kConnectionClosed);
  n.OnConnectionClosed();
  EXPECT_TRUE(DrainEvents(n).empty());

  // After establishment it is the FPDU layer's news, not ours.
  const InitiatorRun r = FeedInitiator(Initiator(MpaDialect::kV1), Frame(kRep, 0x0001));
  r.n->OnConnectionClosed();
  EXPECT_TRUE(DrainEvents(*r.n).empty());
  EXPECT_EQ(r.n->state(), NegotiatorState::kFullOperation);
}

TEST(MpaNegotiator, OutputCanBeWrittenInPieces) {
  MpaNegotiator n(Initiator());
  ASSERT_EQ(n.Start(T(0), Ascii("hello")), NegotiatorStatus::kOk);
  const Bytes all = Pending(n);
  ASSERT_EQ(all.size(), 29u);
  n.ConsumeOutput(5);
  EXPECT_EQ(Pending(n), Bytes(all.begin() + 5, all.end()));
  n.ConsumeOutput(100);  // more than pending: clamps
  EXPECT_TRUE(Pending(n).empty());
  n.ConsumeOutput(1);
  EXPECT_TRUE(Pending(n).empty());
}

TEST(MpaNegotiator, NamesArePinned) {
  EXPECT_EQ(MpaDialectName(MpaDialect::kV2), "MPA v2 (RFC 6581)");
  EXPECT_EQ(RtrTypeName(RtrType::kRead), "zero-length RDMA Read");
  EXPECT_EQ(FirstSendRuleName(FirstSendRule::kAfterFirstFpdu), "send after the first FPDU arrives");
  EXPECT_EQ(NegotiatorStateName(NegotiatorState::kAwaitingRtr), "awaiting Rtr");
  EXPECT_EQ(StartupFailureName(StartupFailure::kInitiatorInitiator), "Initiator/Initiator");
  EXPECT_EQ(StartupFailureName(StartupFailure::kEnhancedUnsupported),
            "enhanced establishment not supported");
  EXPECT_EQ(NegotiatorEventTypeName(NegotiatorEventType::kRejected), "rejected");
  EXPECT_EQ(NegotiatorStatusName(NegotiatorStatus::kPrivateDataTooLong), "private data too long");
}

}  // namespace
}  // namespace siwx::mpa
