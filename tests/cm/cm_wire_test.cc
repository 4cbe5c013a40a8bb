// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The CM against raw TCP peers: the exact MPA startup octets it sends as
// Initiator and Responder (RFC 5044 7.1.1, the Rtr/S-bit proposal, RFC 6581
// 6 and 9), and every malformed or hostile peer ending in its documented
// rdma_cm event within a bounded time, with nothing leaked.
//
// Frame() writes: 16-octet key | M C R S Res Rev (16 bits) | PD_Length (16
// bits) | private data. Flag words used below:
//   0x0001 Rev 1          0x1001 Rev 1 + S (Rtr indicator)
//   0x0002 Rev 2, S = 0   0x1002 Rev 2 + S (enhanced: IRD/ORD word first)
//   0x3002 R + S, Rev 2   0x5002 C + S, Rev 2     0x9002 M + S, Rev 2
//   0x0800 L: Linux siw's MPA_RR_FLAG_GSO_EXP, large FPDUs, an RFC 5044
//          Res bit; ours carry it only when opted in (SIWX_MPA_LARGE_FPDUS=1)
// IrdOrd(): |A|B| IRD |C|D| ORD|, A = 0x8000 and B = 0x4000 in the IRD half,
// C = 0x8000 and D = 0x4000 in the ORD half.
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

// What Linux siw (6.1) sends for rping: v2, IRD 1, ORD 1, no private data
// (docs/kernel-siw-interop.md).
Bytes SiwRequest() {
  return Frame(RequestKey(), /*M0 C0 R0 S1, Rev 2*/ 0x1002, /*PD_Length*/ 4,
               IrdOrd(/*IRD*/ 0x0001, /*ORD*/ 0x0001));
}
// The same from a siw with try_gso, and what our Initiator sends with large
// FPDUs opted in.
Bytes SiwRequestWithL() {
  return Frame(RequestKey(), /*M0 C0 R0 S1 L1, Rev 2*/ 0x1802, /*PD_Length*/ 4,
               IrdOrd(/*IRD*/ 0x0001, /*ORD*/ 0x0001));
}

Bytes Prefix(const Bytes& b, std::size_t n) {
  return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(std::min(n, b.size())));
}

// ---- Our Initiator against a raw server ----

class ActiveWire : public LeakCheck {
 protected:
  // Connects a client (options changed by `configure`) to a raw server and
  // returns the raw side of the connection after reading `request_size`
  // octets into `request`.
  Fd Start(std::size_t request_size, Bytes* request,
           const std::function<void(siwx_cm_mpa_options&)>& configure = nullptr,
           const Bytes& pd = {}, std::uint8_t resp_res = 1, std::uint8_t init_depth = 1) {
    raw_listener_ = RawListen(&port_);
    client_.Resolve(port_, [&](rdma_cm_id* id) {
      ShortTimeouts(id);
      if (configure) SetOptions(id, configure);
    });
    EXPECT_EQ(client_.Connect(pd, resp_res, init_depth), 0);
    Fd peer = RawAccept(raw_listener_);
    EXPECT_TRUE(peer.valid());
    *request = ReadN(peer, request_size);
    return peer;
  }
  void TearDown() override {
    client_.Stop();
    raw_listener_.Reset();
    ExpectNoLeaks();
  }

  Fd raw_listener_;
  std::uint16_t port_ = 0;
  Client client_;
};

// Standard framing by default: the Request is Linux siw's (6.1, rping,
// IRD/ORD 1/1), octet for octet, written out here rather than built by
// Frame(): key, then M0 C0 R0 S1 and no reserved bit (RFC 5044 7.1.1: Res
// is sent as zero), Rev 2, PD_Length 4, the RFC 6581 IRD/ORD word.
TEST_F(ActiveWire, DefaultRequestIsLinuxSiwsOctetForOctet) {
  Bytes request;
  Fd peer = Start(24, &request);
  const Bytes siw = {0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,   // "MPA ID R"
                     0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,   // "eq Frame"
                     0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01};
  EXPECT_EQ(request, siw);
}

TEST_F(ActiveWire, RequestIsWhatLinuxSiwSendsAndAV2ReplyEstablishes) {
  Bytes request;
  Fd peer = Start(24, &request);
  EXPECT_EQ(request, SiwRequest());
  WriteAll(peer, Frame(ReplyKey(), /*S, Rev 2*/ 0x1002, /*PD_Length*/ 4 + 3,
                       Concat({IrdOrd(0x0001, 0x0001), Ascii("srv")})));
  const EventCopy e = Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(e.private_data, Ascii("srv"));
  EXPECT_EQ(e.responder_resources, 1);
  EXPECT_EQ(e.initiator_depth, 1);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V2));
  EXPECT_EQ(ci.mpa_revision, 2u);
  // A peer that knows nothing of L answers without it: MULPDU FPDUs.
  EXPECT_EQ(ci.large_fpdus, 0u);
  // The peer closing the stream is a disconnect.
  peer.Reset();
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_DISCONNECTED).status, 0);
}

TEST_F(ActiveWire, V1RequestCarriesThePrivateData) {
  Bytes request;
  Fd peer = Start(23, &request, [](siwx_cm_mpa_options& o) { o.dialect = SIWX_MPA_DIALECT_V1; },
                  Ascii("abc"));
  EXPECT_EQ(request, Frame(RequestKey(), /*Rev 1*/ 0x0001, /*PD_Length*/ 3, Ascii("abc")));
  WriteAll(peer, Frame(ReplyKey(), 0x0001, 2, Ascii("xy")));
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED).private_data, Ascii("xy"));
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1));
  EXPECT_EQ(ci.mpa_revision, 1u);
  EXPECT_EQ(ci.ird_ord_exchanged, 0u);
  EXPECT_EQ(ci.peer_ird_ord_valid, 0u);
  EXPECT_EQ(ci.ird, 1u);  // the local values, nothing exchanged
  EXPECT_EQ(ci.ord, 1u);
  EXPECT_EQ(ci.large_fpdus, 0u);
}

TEST_F(ActiveWire, ReplyWithLAgreesOnLargeFpdusInEveryDialect) {
  struct Case {
    std::uint32_t dialect;
    std::uint16_t flags;  // of Request and Reply alike
    Bytes pd;
  };
  const Case cases[] = {{SIWX_MPA_DIALECT_V2, 0x1802, IrdOrd(0x0001, 0x0001)},
                        {SIWX_MPA_DIALECT_V1_RTR, 0x1801, {}},
                        {SIWX_MPA_DIALECT_V1, 0x0801, {}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dialect);
    Bytes request;
    Fd peer = Start(20 + c.pd.size(), &request, [&](siwx_cm_mpa_options& o) {
      o.dialect = c.dialect;
      o.large_fpdus = 1;  // opted in
    });
    EXPECT_EQ(request, Frame(RequestKey(), c.flags, static_cast<std::uint16_t>(c.pd.size()), c.pd));
    // What Linux siw answers: the Request's flags word, key rewritten.
    WriteAll(peer, Frame(ReplyKey(), c.flags, static_cast<std::uint16_t>(c.pd.size()), c.pd));
    if (c.dialect == SIWX_MPA_DIALECT_V1_RTR) {
      EXPECT_EQ(ReadN(peer, 20), Frame(RtrKey(), /*no L*/ 0x0001, 0));
    }
    Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(Info(client_.id).large_fpdus, 1u);
    client_.Stop();
    raw_listener_.Reset();
  }
}

TEST_F(ActiveWire, LargeFpdusOffSendsTheRequestOfASiwWithoutTryGso) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.large_fpdus = 0; });
  EXPECT_EQ(request, SiwRequest());
  // An L the Request did not offer makes no agreement.
  WriteAll(peer, Frame(ReplyKey(), 0x1802, 4, IrdOrd(0x0001, 0x0001)));
  Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(client_.id).large_fpdus, 0u);
}

TEST_F(ActiveWire, V1RtrSendsTheRtrFrameAfterAnAcceptingReply) {
  Bytes request;
  Fd peer = Start(20, &request,
                  [](siwx_cm_mpa_options& o) { o.dialect = SIWX_MPA_DIALECT_V1_RTR; });
  EXPECT_EQ(request, Frame(RequestKey(), /*S, Rev 1*/ 0x1001, 0));
  WriteAll(peer, Frame(ReplyKey(), 0x1001, 0));
  EXPECT_EQ(ReadN(peer, 20), Frame(RtrKey(), /*Rev 1, C as in the Reply*/ 0x0001, 0));
  Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(client_.id).dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1_RTR));
}

TEST_F(ActiveWire, V1RtrFallsBackToV1OnAReplyWithoutS) {
  Bytes request;
  Fd peer = Start(20, &request,
                  [](siwx_cm_mpa_options& o) { o.dialect = SIWX_MPA_DIALECT_V1_RTR; });
  WriteAll(peer, Frame(ReplyKey(), 0x0001, 0));
  Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(client_.id).dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1));
  EXPECT_EQ(ReadN(peer, 1, 150ms), Bytes{});  // no Rtr frame
}

TEST_F(ActiveWire, CrcRequiredSetsC) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; });
  EXPECT_EQ(request, Frame(RequestKey(), /*C, S, Rev 2*/ 0x5002, 4, IrdOrd(0x0001, 0x0001)));
  WriteAll(peer, Frame(ReplyKey(), 0x5002, 4, IrdOrd(0x0001, 0x0001)));
  Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(client_.id).crc, 1u);
}

TEST_F(ActiveWire, MarkersRequiredSetsM) {
  Bytes request;
  Fd peer =
      Start(24, &request, [](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REQUIRE; });
  EXPECT_EQ(request, Frame(RequestKey(), /*M, S, Rev 2*/ 0x9002, 4, IrdOrd(0x0001, 0x0001)));
}

TEST_F(ActiveWire, PeerToPeerOffersEveryRtrType) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.peer_to_peer = 1; });
  // A and B (Send) in the IRD half, C (Write) and D (Read) in the ORD half.
  EXPECT_EQ(request, Frame(RequestKey(), 0x1002, 4, IrdOrd(0xC001, 0xC001)));
  // The Responder echoes A and keeps only D (Read).
  WriteAll(peer, Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x8001, 0x4001)));
  Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.peer_to_peer, 1u);
  EXPECT_EQ(ci.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_SEND));
  EXPECT_EQ(ci.rtr_message, static_cast<std::uint32_t>(SIWX_RTR_MESSAGE_READ));
  EXPECT_EQ(ci.rtr_mask, SIWX_RTR_MASK_READ);
}

TEST_F(ActiveWire, RejectingReplyDeliversItsPrivateData) {
  Bytes request;
  Fd peer = Start(24, &request);
  WriteAll(peer, Frame(ReplyKey(), /*R, S, Rev 2*/ 0x3002, 4 + 4,
                       Concat({IrdOrd(0x0000, 0x0000), Ascii("nope")})));
  const EventCopy e = Expect(client_.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(e.status, -ECONNREFUSED);
  EXPECT_EQ(e.private_data, Ascii("nope"));
  EXPECT_TRUE(WaitClosed(peer));
}

// The Terminate FPDU the Initiator sends when an accepting Reply cannot be
// met (RFC 6581 9.1, 9.2): layer LLP, error type MPA, code `code`.
Bytes TerminateFpdu(std::uint8_t code) {
  return {
      0x00, 0x16,              // ULPDU_Length 22 (RFC 5044 4.1)
      0x41,                    // DDP: T = 0, L = 1, DV = 1 (RFC 5041 5.1)
      0x47,                    // RDMAP: RV = 1, opcode 0x7 Terminate (RFC 5040 4.3)
      0x00, 0x00, 0x00, 0x00,  // reserved (no STag to invalidate)
      0x00, 0x00, 0x00, 0x02,  // QN 2: the Terminate queue (RFC 5040 5.1)
      0x00, 0x00, 0x00, 0x01,  // MSN 1: its first message
      0x00, 0x00, 0x00, 0x00,  // MO 0
      0x20,                    // Layer 2 (LLP), EType 0 (MPA) (RFC 5040 4.8, RFC 6581 8)
      code,                    // Error Code
      0x00, 0x00,              // M = D = R = 0, reserved
      // no pad: 2 + 22 is a multiple of 4
      0x00, 0x00, 0x00, 0x00,  // CRC field, zero: CRC not negotiated
  };
}

TEST_F(ActiveWire, ResponderOrdAboveOurIrdSendsTerminate6) {
  Bytes request;
  Fd peer = Start(24, &request);  // IRD 1
  WriteAll(peer, Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x0001, /*ORD*/ 0x0005)));
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -EPROTO);
  EXPECT_EQ(ReadN(peer, 28), TerminateFpdu(6));
  EXPECT_TRUE(WaitClosed(peer));
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.mpa_error, 6u);
  EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_INSUFFICIENT_IRD));
  EXPECT_EQ(ci.peer_ird_ord_valid, 1u);
  EXPECT_EQ(ci.peer_ord, 5u);
}

TEST_F(ActiveWire, PeerToPeerAnsweredWithoutASendsTerminate7) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.peer_to_peer = 1; });
  WriteAll(peer, Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x0001, 0x0001)));
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -EPROTO);
  EXPECT_EQ(ReadN(peer, 28), TerminateFpdu(7));
  EXPECT_EQ(Info(client_.id).mpa_error, 7u);
}

TEST_F(ActiveWire, CrcTerminateCarriesTheCrc) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.crc = SIWX_CM_POLICY_REQUIRE; });
  WriteAll(peer, Frame(ReplyKey(), 0x5002, 4, IrdOrd(0x0001, 0x0009)));
  Expect(client_.channel, RDMA_CM_EVENT_CONNECT_ERROR);
  const Bytes fpdu = ReadN(peer, 28);
  ASSERT_EQ(fpdu.size(), 28u);
  EXPECT_EQ(Prefix(fpdu, 24),
            Prefix(TerminateFpdu(6), 24));
  EXPECT_NE(Bytes(fpdu.begin() + 24, fpdu.end()), Bytes(4, 0));  // a real CRC32c
}

// Replies that end the connection with CONNECT_ERROR (-EPROTO, MPA error 4,
// "invalid startup frame", RFC 5044 8).
struct BadReply {
  const char* name;
  Bytes reply;
  siwx_cm_failure failure;
};

class ActiveBadReply : public ActiveWire, public ::testing::WithParamInterface<BadReply> {};

TEST_P(ActiveBadReply, EndsInConnectError) {
  Bytes request;
  Fd peer = Start(24, &request);
  const auto start = std::chrono::steady_clock::now();
  WriteAll(peer, GetParam().reply);
  const EventCopy e = Expect(client_.channel, RDMA_CM_EVENT_CONNECT_ERROR, 2000ms);
  EXPECT_EQ(e.status, -EPROTO);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms);
  const siwx_cm_conn_info ci = Info(client_.id);
  EXPECT_EQ(ci.mpa_error, 4u);
  EXPECT_EQ(ci.dialect, 0u);
  EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(GetParam().failure));
  EXPECT_NE(ci.failure[0], '\0');
  EXPECT_TRUE(WaitClosed(peer));
}

INSTANTIATE_TEST_SUITE_P(
    Replies, ActiveBadReply,
    ::testing::Values(
        BadReply{"Http", Ascii("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
                 SIWX_CM_FAILURE_BAD_KEY},
        BadReply{"WrongKey", Frame(Ascii("MPA ID Rex Frame"), 0x1002, 4, IrdOrd(1, 1)),
                 SIWX_CM_FAILURE_BAD_KEY},
        BadReply{"RevisionZero", Frame(ReplyKey(), 0x1000, 4, IrdOrd(1, 1)),
                 SIWX_CM_FAILURE_BAD_REVISION},
        BadReply{"RevisionThree", Frame(ReplyKey(), 0x1003, 4, IrdOrd(1, 1)),
                 SIWX_CM_FAILURE_BAD_REVISION},
        BadReply{"PdLengthOver512", Frame(ReplyKey(), 0x1002, 513),
                 SIWX_CM_FAILURE_PRIVATE_DATA_TOO_LONG},
        BadReply{"EnhancedWithoutIrdOrd", Frame(ReplyKey(), 0x1002, 2, Bytes{0, 1}),
                 SIWX_CM_FAILURE_MISSING_IRD_ORD},
        BadReply{"InitiatorInitiator", SiwRequest(), SIWX_CM_FAILURE_INITIATOR_INITIATOR},
        BadReply{"RtrFrameInsteadOfReply", Frame(RtrKey(), 0x0001, 0),
                 SIWX_CM_FAILURE_UNEXPECTED_FRAME},
        BadReply{"UnenhancedReplyToEnhancedRequest", Frame(ReplyKey(), 0x0001, 0),
                 SIWX_CM_FAILURE_ENHANCED_MISMATCH}),
    [](const ::testing::TestParamInfo<BadReply>& p) { return std::string(p.param.name); });

TEST_F(ActiveWire, MarkersAskedByThePeerAndRefused) {
  Bytes request;
  Fd peer = Start(24, &request, [](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REFUSE; });
  WriteAll(peer, Frame(ReplyKey(), 0x9002, 4, IrdOrd(1, 1)));
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -EPROTO);
  EXPECT_EQ(Info(client_.id).failure_code,
            static_cast<std::uint32_t>(SIWX_CM_FAILURE_MARKERS_REFUSED));
}

TEST_F(ActiveWire, SilentServerTimesOut) {
  Bytes request;
  const auto start = std::chrono::steady_clock::now();
  Fd peer = Start(24, &request);
  EXPECT_EQ(request, SiwRequest());
  const EventCopy e = Expect(client_.channel, RDMA_CM_EVENT_UNREACHABLE, 3000ms);
  EXPECT_EQ(e.status, -ETIMEDOUT);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 2000ms);
  EXPECT_EQ(Info(client_.id).mpa_error, 1u);
  EXPECT_EQ(Info(client_.id).failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_TIMEOUT));
  EXPECT_TRUE(WaitClosed(peer));
}

TEST_F(ActiveWire, PrivateDataBeyondTheOctetsSentTimesOut) {
  Bytes request;
  Fd peer = Start(24, &request);
  // PD_Length 100, then 10 octets and silence.
  WriteAll(peer, Frame(ReplyKey(), 0x1002, 100, Concat({IrdOrd(1, 1), Bytes(6, 0xAA)})));
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_UNREACHABLE, 3000ms).status, -ETIMEDOUT);
  EXPECT_TRUE(WaitClosed(peer));
}

TEST_F(ActiveWire, PrivateDataBeyondTheOctetsSentThenClose) {
  Bytes request;
  Fd peer = Start(24, &request);
  WriteAll(peer, Frame(ReplyKey(), 0x1002, 100, Concat({IrdOrd(1, 1), Bytes(6, 0xAA)})));
  peer.Reset();
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNRESET);
  EXPECT_EQ(Info(client_.id).mpa_error, 1u);
}

TEST_F(ActiveWire, ResetInTheMiddleOfTheReply) {
  Bytes request;
  Fd peer = Start(24, &request);
  const Bytes reply = Frame(ReplyKey(), 0x1002, 4, IrdOrd(1, 1));
  WriteAll(peer, Bytes(reply.begin(), reply.begin() + 10));
  std::this_thread::sleep_for(20ms);
  peer.Abort();
  const EventCopy e = Expect(client_.channel, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(e.status, -ECONNRESET);
  EXPECT_EQ(Info(client_.id).failure_code,
            static_cast<std::uint32_t>(SIWX_CM_FAILURE_CONNECTION_CLOSED));
}

TEST_F(ActiveWire, EveryPrefixOfTheReplyThenClose) {
  // Truncation at every point of a Reply ends in REJECTED, never in
  // ESTABLISHED or a crash.
  const Bytes reply =
      Frame(ReplyKey(), 0x1002, 4 + 2, Concat({IrdOrd(0x0001, 0x0001), Ascii("ok")}));
  for (std::size_t cut = 0; cut < reply.size(); ++cut) {
    SCOPED_TRACE(cut);
    Bytes request;
    Fd peer = Start(24, &request);
    WriteAll(peer, Bytes(reply.begin(), reply.begin() + static_cast<std::ptrdiff_t>(cut)));
    peer.Reset();
    EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNRESET);
    client_.Stop();
    raw_listener_.Reset();
  }
}

TEST_F(ActiveWire, ReplyOneOctetAtATime) {
  Bytes request;
  Fd peer = Start(24, &request);
  const Bytes reply =
      Frame(ReplyKey(), 0x1002, 4 + 5, Concat({IrdOrd(0x0001, 0x0001), Ascii("slow!")}));
  for (std::uint8_t b : reply) {
    WriteAll(peer, {b});
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(Expect(client_.channel, RDMA_CM_EVENT_ESTABLISHED).private_data, Ascii("slow!"));
}

// ---- A raw client against our Responder ----

class PassiveWire : public LeakCheck {
 protected:
  void SetUp() override {
    LeakCheck::SetUp();
    listener_.Start(8, [&](rdma_cm_id* id) {
      ShortTimeouts(id);
      if (configure_) SetOptions(id, configure_);
    });
  }
  void TearDown() override {
    for (rdma_cm_id* id : accepted_) EXPECT_EQ(rdma_destroy_id(id), 0);
    listener_.Stop();
    ExpectNoLeaks();
  }
  // A request from a raw client; returns the new id from CONNECT_REQUEST.
  rdma_cm_id* Request(Fd& raw, const Bytes& request, EventCopy* event = nullptr) {
    raw = RawConnect(listener_.port);
    WriteAll(raw, request);
    const EventCopy e = Expect(listener_.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    if (event != nullptr) *event = e;
    if (e.id != nullptr) accepted_.push_back(e.id);
    return e.id;
  }

  std::function<void(siwx_cm_mpa_options&)> configure_;
  Listener listener_;
  std::vector<rdma_cm_id*> accepted_;
};

// The Reply to siw's Request is what a siw Responder sends back (its Request
// header with the Reply key, IRD/ORD 1/1), octet for octet: no reserved bit.
TEST_F(PassiveWire, DefaultReplyIsLinuxSiwsOctetForOctet) {
  Fd raw;
  rdma_cm_id* id = Request(raw, SiwRequest());
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  const Bytes siw = {0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,   // "MPA ID R"
                     0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,   // "ep Frame"
                     0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01};
  EXPECT_EQ(ReadN(raw, 24), siw);
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
}

TEST_F(PassiveWire, LinuxSiwRequestGetsAnEnhancedReply) {
  Fd raw;
  EventCopy req;
  rdma_cm_id* id = Request(raw, SiwRequest(), &req);
  ASSERT_NE(id, nullptr);
  EXPECT_EQ(req.private_data, Bytes{});
  EXPECT_EQ(req.responder_resources, 1);  // min(device limit, peer ORD 1)
  EXPECT_EQ(req.initiator_depth, 1);      // min(device limit, peer IRD 1)
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), /*S, Rev 2*/ 0x1002, 4, IrdOrd(0x0001, 0x0001)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  const siwx_cm_conn_info si = Info(id);
  EXPECT_EQ(si.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V2));
  EXPECT_EQ(si.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_NONE));
  EXPECT_EQ(si.large_fpdus, 0u);  // no L in the Request (and none in the Reply above)
  raw.Reset();
  Expect(listener_.channel, RDMA_CM_EVENT_DISCONNECTED);
}

TEST_F(PassiveWire, LinuxSiwTryGsoRequestGetsAStandardReplyByDefault) {
  Fd raw;
  rdma_cm_id* id = Request(raw, SiwRequestWithL());
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), /*S, Rev 2*/ 0x1002, 4, IrdOrd(0x0001, 0x0001)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(id).large_fpdus, 0u);
}

class PassiveWireWithLargeFpdus : public PassiveWire {
 protected:
  void SetUp() override {
    configure_ = [](siwx_cm_mpa_options& o) { o.large_fpdus = 1; };
    PassiveWire::SetUp();
  }
};

TEST_F(PassiveWireWithLargeFpdus, LinuxSiwTryGsoRequestGetsLInTheReply) {
  Fd raw;
  rdma_cm_id* id = Request(raw, SiwRequestWithL());
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), /*S, L, Rev 2*/ 0x1802, 4, IrdOrd(0x0001, 0x0001)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(id).large_fpdus, 1u);
}

TEST_F(PassiveWire, V1RequestAndReplyWithPrivateData) {
  Fd raw;
  EventCopy req;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x0001, 5, Ascii("hello")), &req);
  ASSERT_NE(id, nullptr);
  EXPECT_EQ(req.private_data, Ascii("hello"));
  if (id->verbs == nullptr) {
    // v1 says nothing of the peer's depths: the (CM-only) device limits.
    EXPECT_EQ(req.responder_resources, 128);
    EXPECT_EQ(req.initiator_depth, 128);
  }
  rdma_conn_param p{};
  p.private_data = "world";
  p.private_data_len = 5;
  ASSERT_EQ(rdma_accept(id, &p), 0);
  EXPECT_EQ(ReadN(raw, 25), Frame(ReplyKey(), 0x0001, 5, Ascii("world")));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(id).dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1));
}

TEST_F(PassiveWire, Rev2WithoutSIsUnenhanced) {
  Fd raw;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), /*Rev 2, S = 0*/ 0x0002, 0));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  // RFC 6581 10: an unenhanced Reply; a v2 Responder keeps Rev 2.
  EXPECT_EQ(ReadN(raw, 20), Frame(ReplyKey(), 0x0002, 0));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  const siwx_cm_conn_info si = Info(id);
  EXPECT_EQ(si.dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1));
  EXPECT_EQ(si.mpa_revision, 2u);
}

TEST_F(PassiveWire, V1RtrIsEstablishedOnlyByTheRtrFrame) {
  Fd raw;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), /*S, Rev 1*/ 0x1001, 0));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 20), Frame(ReplyKey(), 0x1001, 0));
  EXPECT_FALSE(NextEvent(listener_.channel, 150ms).has_value());
  WriteAll(raw, Frame(RtrKey(), 0x0001, 0));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(id).dialect, static_cast<std::uint32_t>(SIWX_MPA_DIALECT_V1_RTR));
}

TEST_F(PassiveWire, RtrFrameWithTheWrongCFailsTheAcceptedConnection) {
  Fd raw;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x1001, 0));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 20), Frame(ReplyKey(), 0x1001, 0));
  WriteAll(raw, Frame(RtrKey(), /*C*/ 0x4001, 0));
  EXPECT_EQ(Expect(listener_.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -EPROTO);
  EXPECT_EQ(Info(id).failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_RTR_CRC_MISMATCH));
  EXPECT_TRUE(WaitClosed(raw));
}

TEST_F(PassiveWire, RtrFrameThatNeverComesTimesOut) {
  Fd raw;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x1001, 0));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(Expect(listener_.channel, RDMA_CM_EVENT_UNREACHABLE, 3000ms).status, -ETIMEDOUT);
  EXPECT_TRUE(WaitClosed(raw));
}

TEST_F(PassiveWire, ApplicationRejectWithPrivateData) {
  Fd raw;
  rdma_cm_id* id = Request(raw, SiwRequest());
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_reject(id, "go away", 7), 0);
  // R = 1, an enhanced Reply offering IRD = ORD = 0 (RFC 6581 9.1, 10).
  EXPECT_EQ(ReadN(raw, 31), Frame(ReplyKey(), /*R, S, Rev 2*/ 0x3002, 4 + 7,
                                  Concat({IrdOrd(0x0000, 0x0000), Ascii("go away")})));
  EXPECT_TRUE(WaitClosed(raw));
}

TEST_F(PassiveWire, CrcRequestedIsEchoed) {
  Fd raw;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x5002, 4, IrdOrd(0x0001, 0x0001)));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), /*C, S, Rev 2*/ 0x5002, 4, IrdOrd(1, 1)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(Info(id).crc, 1u);
}

TEST_F(PassiveWire, PeerToPeerRequestIsAnsweredWithTheCommonRtrTypes) {
  Fd raw;
  // A, and C (Write) only.
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x1002, 4, IrdOrd(0x8001, 0x8001)));
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x8001, 0x8001)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
  const siwx_cm_conn_info si = Info(id);
  EXPECT_EQ(si.peer_to_peer, 1u);
  EXPECT_EQ(si.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_AWAIT));
  EXPECT_EQ(si.rtr_mask, SIWX_RTR_MASK_WRITE);
}

TEST_F(PassiveWire, PrivateDataLongerThanAnEventCarries) {
  Bytes pd(300);
  for (std::size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<std::uint8_t>(i * 7);
  Fd raw;
  EventCopy req;
  rdma_cm_id* id = Request(raw, Frame(RequestKey(), 0x0001, 300, pd), &req);
  ASSERT_NE(id, nullptr);
  EXPECT_EQ(req.private_data, Bytes(pd.begin(), pd.begin() + 255));
  Bytes all(512);
  EXPECT_EQ(siwx_cm_peer_private_data(id, all.data(), all.size()), 300);
  EXPECT_EQ(Bytes(all.begin(), all.begin() + 300), pd);
  EXPECT_EQ(Info(id).peer_private_data_len, 300u);
}

class PassiveWireRefusingMarkers : public PassiveWire {
 protected:
  void SetUp() override {
    configure_ = [](siwx_cm_mpa_options& o) { o.markers = SIWX_CM_POLICY_REFUSE; };
    PassiveWire::SetUp();
  }
};

TEST_F(PassiveWireRefusingMarkers, RejectedBeforeTheApplicationSeesIt) {
  Fd raw = RawConnect(listener_.port);
  WriteAll(raw, Frame(RequestKey(), /*M, S, Rev 2*/ 0x9002, 4, IrdOrd(1, 1)));
  EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), /*R, S, Rev 2*/ 0x3002, 4, IrdOrd(0, 0)));
  EXPECT_TRUE(WaitClosed(raw));
  EXPECT_FALSE(NextEvent(listener_.channel, 100ms).has_value());
}

// Clients that are not MPA Initiators: each is dropped without an event,
// within the startup timeout, and the listener serves the next client.
struct BadClient {
  const char* name;
  Bytes sent;
  bool close_after = false;  // the client closes (else it waits for us)
  bool abort = false;        // ... with RST
};

class PassiveBadClient : public PassiveWire, public ::testing::WithParamInterface<BadClient> {};

TEST_P(PassiveBadClient, IsDroppedAndTheListenerKeepsServing) {
  const BadClient& bc = GetParam();
  const auto start = std::chrono::steady_clock::now();
  {
    Fd raw = RawConnect(listener_.port);
    if (!bc.sent.empty()) WriteAll(raw, bc.sent);
    if (bc.abort) {
      std::this_thread::sleep_for(20ms);
      raw.Abort();
    } else if (bc.close_after) {
      raw.Reset();
    } else {
      // We close it: at once for a bad frame, after the startup timeout
      // (300 ms) for silence (Responder/Responder, RFC 5044 7.1.2 rule 8).
      EXPECT_TRUE(WaitClosed(raw, 2000ms));
      EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
    }
  }
  EXPECT_FALSE(NextEvent(listener_.channel, 50ms).has_value());
  // The next, well-behaved client is served.
  Fd good;
  rdma_cm_id* id = Request(good, SiwRequest());
  ASSERT_NE(id, nullptr);
  ASSERT_EQ(rdma_accept(id, nullptr), 0);
  EXPECT_EQ(ReadN(good, 24), Frame(ReplyKey(), 0x1002, 4, IrdOrd(1, 1)));
  Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
}

INSTANTIATE_TEST_SUITE_P(
    Clients, PassiveBadClient,
    ::testing::Values(
        BadClient{"HttpGet", Ascii("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
        BadClient{"WrongKey", Frame(Ascii("MPA ID Req Frane"), 0x1002, 4, IrdOrd(1, 1))},
        BadClient{"RevisionZero", Frame(RequestKey(), 0x1000, 4, IrdOrd(1, 1))},
        BadClient{"RevisionThree", Frame(RequestKey(), 0x0003, 0)},
        BadClient{"PdLengthOver512", Frame(RequestKey(), 0x0001, 0xFFFF)},
        BadClient{"EnhancedWithoutIrdOrd", Frame(RequestKey(), 0x1002, 0)},
        BadClient{"ReplyInsteadOfRequest", Frame(ReplyKey(), 0x1002, 4, IrdOrd(1, 1))},
        BadClient{"RtrFrameFirst", Frame(RtrKey(), 0x0001, 0)},
        BadClient{"Silent", {}},  // Responder/Responder
        BadClient{"PdBeyondTheOctetsSent", Frame(RequestKey(), 0x0001, 64, Bytes(8, 1))},
        BadClient{"TruncatedHeaderThenClose",
                  Prefix(SiwRequest(), 11), true},
        BadClient{"ResetMidHeader", Prefix(SiwRequest(), 7), false,
                  true},
        BadClient{"OneOctetThenClose", Bytes(1, 0x4d), true}),
    [](const ::testing::TestParamInfo<BadClient>& p) { return std::string(p.param.name); });

TEST_F(PassiveWire, ResetAfterTheRequestIsRaisedMakesAcceptFail) {
  Fd raw;
  rdma_cm_id* id = Request(raw, SiwRequest());
  ASSERT_NE(id, nullptr);
  raw.Abort();
  EXPECT_TRUE(WaitFor([&] { return Info(id).failure_code != SIWX_CM_FAILURE_NONE; }, 2000ms));
  errno = 0;
  EXPECT_EQ(rdma_accept(id, nullptr), -1);
  EXPECT_EQ(errno, ECONNRESET);
  EXPECT_EQ(Info(id).mpa_error, 1u);
}

TEST_F(PassiveWire, RequestOneOctetAtATime) {
  Fd raw = RawConnect(listener_.port);
  const Bytes request = Frame(RequestKey(), 0x1002, 4 + 3, Concat({IrdOrd(2, 3), Ascii("pd!")}));
  for (std::uint8_t b : request) {
    WriteAll(raw, {b});
    std::this_thread::sleep_for(1ms);
  }
  const EventCopy req = Expect(listener_.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  accepted_.push_back(req.id);
  EXPECT_EQ(req.private_data, Ascii("pd!"));
  EXPECT_EQ(req.responder_resources, 3);  // peer ORD
  EXPECT_EQ(req.initiator_depth, 2);      // peer IRD
}

TEST_F(PassiveWire, EveryPrefixOfTheRequestThenCloseIsDropped) {
  const Bytes request =
      Frame(RequestKey(), 0x1002, 4 + 2, Concat({IrdOrd(0x0001, 0x0001), Ascii("pd")}));
  for (std::size_t cut = 0; cut < request.size(); ++cut) {
    SCOPED_TRACE(cut);
    Fd raw = RawConnect(listener_.port);
    WriteAll(raw, Prefix(request, cut));
    raw.Reset();
  }
  EXPECT_FALSE(NextEvent(listener_.channel, 200ms).has_value());
  // The whole Request still works.
  Fd good;
  EventCopy req;
  ASSERT_NE(Request(good, request, &req), nullptr);
  EXPECT_EQ(req.private_data, Ascii("pd"));
}

TEST_F(PassiveWire, RequestInRandomChunksMatchesTheWholeRequest) {
  const Bytes request =
      Frame(RequestKey(), 0x1002, 4 + 40, Concat({IrdOrd(0x0005, 0x0003), Bytes(40, 0x5A)}));
  std::uint32_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 1103515245u + 12345u;  // a fixed LCG: the same chunks every run
    return (seed >> 16) % 9 + 1;
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    Fd raw = RawConnect(listener_.port);
    for (std::size_t at = 0; at < request.size();) {
      const std::size_t n = std::min<std::size_t>(next(), request.size() - at);
      WriteAll(raw, Bytes(request.begin() + static_cast<std::ptrdiff_t>(at),
                          request.begin() + static_cast<std::ptrdiff_t>(at + n)));
      at += n;
      std::this_thread::sleep_for(1ms);
    }
    const EventCopy req = Expect(listener_.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req.id, nullptr);
    accepted_.push_back(req.id);
    EXPECT_EQ(req.private_data, Bytes(40, 0x5A));
    EXPECT_EQ(req.responder_resources, 3);  // peer ORD
    EXPECT_EQ(req.initiator_depth, 5);      // peer IRD
    ASSERT_EQ(rdma_accept(req.id, nullptr), 0);
    EXPECT_EQ(ReadN(raw, 24), Frame(ReplyKey(), 0x1002, 4, IrdOrd(0x0003, 0x0005)));
    Expect(listener_.channel, RDMA_CM_EVENT_ESTABLISHED);
    raw.Reset();
    EXPECT_EQ(Expect(listener_.channel, RDMA_CM_EVENT_DISCONNECTED).id, req.id);
  }
}

}  // namespace
}  // namespace siwx::cm::test
