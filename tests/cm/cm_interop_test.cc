// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The interop matrix over real connections: siwx's rdma_cm as Initiator and
// as Responder in one process, each end configured per id
// (siwx_cm_set_mpa_options) with its own MPA dialect, peer-to-peer RTR type,
// CRC policy and marker policy. Every cell connects, checks what both ends
// report as negotiated against the result the RFCs prescribe (computed below
// from the rules, not from the implementation), then moves data through the
// verbs provider: an RDMA Write, a Send and an RDMA Read from the Initiator,
// a Send back from the Responder, every octet and completion checked.
// Cells the rules refuse check the documented failure instead.
//
// Every cell of the full matrix runs at the default SIWX_MPA_LARGE_FPDUS=0
// (standard startup frames, MULPDU FPDUs); a smaller set of cells opts one
// or both ends in to the non-standard large FPDUs (siw's L bit), which are
// used only when both did.
//
// Needs siwx devices: ctest runs it under siwx-run (test cm_interop).
#include <algorithm>
#include <string>
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

// ---- The dimensions ----

// What the Initiator offers (SIWX_MPA_DIALECT, SIWX_MPA_P2P) and what the
// Responder accepts: with peer-to-peer, one RTR type.
struct DialectChoice {
  const char* name;
  siwx_mpa_dialect dialect;
  bool peer_to_peer;     // Initiator only: request the RFC 6581 model
  std::uint32_t rtr_mask;  // Initiator: offered; Responder: accepted
};

constexpr std::uint32_t kAllRtr = SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ;

constexpr DialectChoice kInitiatorOffers[] = {
    {"V1", SIWX_MPA_DIALECT_V1, false, kAllRtr},
    {"V1Rtr", SIWX_MPA_DIALECT_V1_RTR, false, kAllRtr},
    {"V2", SIWX_MPA_DIALECT_V2, false, kAllRtr},
    {"V2SendRtr", SIWX_MPA_DIALECT_V2, true, SIWX_RTR_MASK_SEND},
    {"V2WriteRtr", SIWX_MPA_DIALECT_V2, true, SIWX_RTR_MASK_WRITE},
    {"V2ReadRtr", SIWX_MPA_DIALECT_V2, true, SIWX_RTR_MASK_READ},
};

constexpr DialectChoice kResponderAccepts[] = {
    {"V1", SIWX_MPA_DIALECT_V1, false, kAllRtr},
    {"V1Rtr", SIWX_MPA_DIALECT_V1_RTR, false, kAllRtr},
    {"V2", SIWX_MPA_DIALECT_V2, false, kAllRtr},
    {"V2SendRtr", SIWX_MPA_DIALECT_V2, false, SIWX_RTR_MASK_SEND},
    {"V2WriteRtr", SIWX_MPA_DIALECT_V2, false, SIWX_RTR_MASK_WRITE},
    {"V2ReadRtr", SIWX_MPA_DIALECT_V2, false, SIWX_RTR_MASK_READ},
};

// Which ends set "require" (the others "allow").
enum Requirers : std::uint8_t { kNeither = 0, kInitiatorOnly = 1, kResponderOnly = 2, kBoth = 3 };

constexpr const char* RequirersName(Requirers r) {
  switch (r) {
    case kNeither: return "Off";
    case kInitiatorOnly: return "Initiator";
    case kResponderOnly: return "Responder";
    case kBoth: return "Both";
  }
  return "?";
}

struct Cell {
  DialectChoice initiator;
  DialectChoice responder;
  Requirers crc;
  Requirers markers;
  Requirers large_fpdus = kNeither;  // which ends set SIWX_MPA_LARGE_FPDUS=1
};

// ---- The expected result, from the rules ----

enum class Outcome {
  kEstablished,
  // RFC 5044 7.1.1 (Rev) and RFC 6581 10: a Responder that does not speak
  // Rev 2 closes the connection on an enhanced Request, without a Reply.
  kResponderCloses,
  // RFC 6581 9.2: no RTR type both support; the Initiator sends a
  // Terminate (MPA error 7) after the Reply and closes.
  kNoCommonRtr,
};

struct Expected {
  Outcome outcome = Outcome::kEstablished;
  siwx_mpa_dialect dialect = SIWX_MPA_DIALECT_V1;
  std::uint32_t revision = 1;
  bool crc = false;
  bool markers_to_initiator = false;  // the Responder inserts them
  bool markers_to_responder = false;  // the Initiator inserts them
  bool ird_ord_exchanged = false;
  bool peer_to_peer = false;
  std::uint32_t reply_rtr_mask = 0;  // RTR types in the Reply (peer-to-peer only)
  siwx_rtr_message rtr_message = SIWX_RTR_MESSAGE_SEND;
  bool large_fpdus = false;  // both startup frames carried L
};

siwx_rtr_message OnlyType(std::uint32_t mask) {
  if (mask == SIWX_RTR_MASK_WRITE) return SIWX_RTR_MESSAGE_WRITE;
  if (mask == SIWX_RTR_MASK_READ) return SIWX_RTR_MESSAGE_READ;
  return SIWX_RTR_MESSAGE_SEND;
}

Expected ExpectedResult(const Cell& cell) {
  Expected e;
  const siwx_mpa_dialect offered = cell.initiator.dialect;
  const siwx_mpa_dialect highest = cell.responder.dialect;
  // Rev 2 Request to a Rev 1 Responder.
  if (offered == SIWX_MPA_DIALECT_V2 && highest != SIWX_MPA_DIALECT_V2) {
    e.outcome = Outcome::kResponderCloses;
    return e;
  }
  if (offered == SIWX_MPA_DIALECT_V1) {
    e.dialect = SIWX_MPA_DIALECT_V1;
  } else if (offered == SIWX_MPA_DIALECT_V1_RTR) {
    // The proposal's S bit is a reserved bit to an RFC 5044 Responder,
    // which answers with it clear: plain v1, no Rtr frame.
    e.dialect = highest == SIWX_MPA_DIALECT_V1 ? SIWX_MPA_DIALECT_V1 : SIWX_MPA_DIALECT_V1_RTR;
  } else {
    e.dialect = SIWX_MPA_DIALECT_V2;
  }
  e.revision = e.dialect == SIWX_MPA_DIALECT_V2 ? 2 : 1;
  e.ird_ord_exchanged = e.dialect == SIWX_MPA_DIALECT_V2;
  // RFC 5044 7.1.1 C: CRC is used both ways when either frame sets C.
  e.crc = cell.crc != kNeither;
  // M: "markers MUST be added when transmitting to this peer", per frame,
  // so per direction.
  e.markers_to_initiator = (cell.markers & kInitiatorOnly) != 0;
  e.markers_to_responder = (cell.markers & kResponderOnly) != 0;
  // L (not an RFC feature): only when the Request offered it and the
  // Responder accepts it, in every dialect.
  e.large_fpdus = cell.large_fpdus == kBoth;
  // RFC 6581 9.2: A in the Reply echoes A; the Reply lists the offered
  // types the Responder supports, or all it supports when none of them.
  if (e.dialect == SIWX_MPA_DIALECT_V2 && cell.initiator.peer_to_peer) {
    e.peer_to_peer = true;
    const std::uint32_t common = cell.initiator.rtr_mask & cell.responder.rtr_mask;
    e.reply_rtr_mask = common != 0 ? common : cell.responder.rtr_mask;
    if (common == 0) e.outcome = Outcome::kNoCommonRtr;
    e.rtr_message = OnlyType(cell.initiator.rtr_mask);  // the one type offered
  }
  return e;
}

std::string CellName(const ::testing::TestParamInfo<Cell>& info) {
  const Cell& c = info.param;
  std::string name = std::string("Init") + c.initiator.name + "_Resp" + c.responder.name +
                     "_Crc" + RequirersName(c.crc) + "_Markers" + RequirersName(c.markers);
  if (c.large_fpdus != kNeither) name += std::string("_Large") + RequirersName(c.large_fpdus);
  return name;
}

std::vector<Cell> AllCells() {
  std::vector<Cell> cells;
  for (const DialectChoice& i : kInitiatorOffers) {
    for (const DialectChoice& r : kResponderAccepts) {
      for (Requirers crc : {kNeither, kInitiatorOnly, kResponderOnly, kBoth}) {
        for (Requirers markers : {kNeither, kInitiatorOnly, kResponderOnly, kBoth}) {
          cells.push_back(Cell{i, r, crc, markers});
        }
      }
    }
  }
  // The opt-in: each dialect against itself, CRC on, with and without
  // markers, L set by one end or both.
  for (std::size_t d = 0; d < std::size(kInitiatorOffers); ++d) {
    for (Requirers markers : {kNeither, kBoth}) {
      for (Requirers large : {kInitiatorOnly, kResponderOnly, kBoth}) {
        cells.push_back(Cell{kInitiatorOffers[d], kResponderAccepts[d], kBoth, markers, large});
      }
    }
  }
  return cells;
}

// ---- Verbs helpers ----

// The data of one operation: octet i of pattern `seed`.
std::uint8_t PatternOctet(std::uint32_t seed, std::size_t i) {
  return static_cast<std::uint8_t>(seed * 29u + i * 131u + (i >> 9));
}

void Fill(std::vector<std::uint8_t>& buf, std::uint32_t seed) {
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = PatternOctet(seed, i);
}

// Index of the first octet that differs from the pattern, or -1.
long FirstMismatch(const std::uint8_t* data, std::size_t len, std::uint32_t seed) {
  for (std::size_t i = 0; i < len; ++i) {
    if (data[i] != PatternOctet(seed, i)) return static_cast<long>(i);
  }
  return -1;
}

std::optional<ibv_wc> PollOne(ibv_cq* cq, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n == 1) return wc;
    if (n < 0 || std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(100us);
  }
}

// A registered buffer.
struct Buffer {
  std::vector<std::uint8_t> data;
  ibv_mr* mr = nullptr;

  void Register(ibv_pd* pd, std::size_t size, int access) {
    data.assign(size, 0);
    mr = ibv_reg_mr(pd, data.data(), data.size(), access);
    ASSERT_NE(mr, nullptr) << "ibv_reg_mr: errno " << errno;
  }
  std::uintptr_t addr() const { return reinterpret_cast<std::uintptr_t>(data.data()); }
  ~Buffer() {
    if (mr != nullptr) ibv_dereg_mr(mr);
  }
};

void PostRecv(ibv_qp* qp, Buffer& b, std::uint64_t wr_id) {
  ibv_sge sge{b.addr(), static_cast<std::uint32_t>(b.data.size()), b.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
}

void PostSend(ibv_qp* qp, ibv_wr_opcode opcode, Buffer& local, std::size_t len,
              std::uint64_t wr_id, std::uint64_t remote_addr = 0, std::uint32_t rkey = 0) {
  ibv_sge sge{local.addr(), static_cast<std::uint32_t>(len), local.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0) << "errno " << errno;
}

void ExpectCompletion(ibv_cq* cq, std::uint64_t wr_id, ibv_wc_opcode opcode, const char* what) {
  const std::optional<ibv_wc> wc = PollOne(cq);
  ASSERT_TRUE(wc.has_value()) << what << ": no completion within 5 s";
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << what << ": " << ibv_wc_status_str(wc->status);
  EXPECT_EQ(wc->wr_id, wr_id) << what;
  EXPECT_EQ(wc->opcode, opcode) << what;
}

void ExpectReceive(ibv_cq* cq, std::uint64_t wr_id, std::size_t len, const char* what) {
  const std::optional<ibv_wc> wc = PollOne(cq);
  ASSERT_TRUE(wc.has_value()) << what << ": no receive completion within 5 s";
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << what << ": " << ibv_wc_status_str(wc->status);
  EXPECT_EQ(wc->wr_id, wr_id) << what;
  EXPECT_EQ(wc->opcode, IBV_WC_RECV) << what;
  EXPECT_EQ(wc->byte_len, len) << what;
}

ibv_qp_init_attr QpAttr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  return a;
}

// Sizes chosen to span several FPDUs and marker intervals (512 octets).
constexpr std::size_t kSendLen = 5003;
constexpr std::size_t kWriteLen = 70001;
constexpr std::size_t kReadLen = 9001;
constexpr std::size_t kReplyLen = 3001;
constexpr int kRemoteAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// ---- The test ----

void ApplyPolicy(siwx_cm_mpa_options& o, bool crc_required, bool markers_required) {
  o.crc = crc_required ? SIWX_CM_POLICY_REQUIRE : SIWX_CM_POLICY_ALLOW;
  o.markers = markers_required ? SIWX_CM_POLICY_REQUIRE : SIWX_CM_POLICY_ALLOW;
}

template <typename Param>
class NeedsDevices : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (auto why = MissingSiwxDevice()) GTEST_SKIP() << *why;
  }
};

class CmInterop : public NeedsDevices<Cell> {};

// The negotiated result at one end, as that end names directions.
void ExpectNegotiated(const siwx_cm_conn_info& info, const Expected& e, bool initiator) {
  const char* end = initiator ? "Initiator" : "Responder";
  EXPECT_EQ(info.role, initiator ? 1u : 2u) << end;
  EXPECT_EQ(info.dialect, static_cast<std::uint32_t>(e.dialect)) << end;
  EXPECT_EQ(info.mpa_revision, e.revision) << end;
  EXPECT_EQ(info.crc, e.crc ? 1u : 0u) << end;
  const bool tx = initiator ? e.markers_to_responder : e.markers_to_initiator;
  const bool rx = initiator ? e.markers_to_initiator : e.markers_to_responder;
  EXPECT_EQ(info.tx_markers, tx ? 1u : 0u) << end;
  EXPECT_EQ(info.rx_markers, rx ? 1u : 0u) << end;
  EXPECT_EQ(info.ird_ord_exchanged, e.ird_ord_exchanged ? 1u : 0u) << end;
  if (e.ird_ord_exchanged) {
    // Both ends asked IRD 1 / ORD 1 (RFC 6581 9.1).
    EXPECT_EQ(info.ird, 1u) << end;
    EXPECT_EQ(info.ord, 1u) << end;
  }
  EXPECT_EQ(info.peer_to_peer, e.peer_to_peer ? 1u : 0u) << end;
  if (!e.peer_to_peer) {
    // The proposal's Rtr frame is an MPA frame, not an RDMA message.
    EXPECT_EQ(info.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_NONE)) << end;
  } else if (initiator) {
    EXPECT_EQ(info.rtr_mask, e.reply_rtr_mask) << end;
    if (e.outcome == Outcome::kEstablished) {
      EXPECT_EQ(info.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_SEND)) << end;
      EXPECT_EQ(info.rtr_message, static_cast<std::uint32_t>(e.rtr_message)) << end;
    }
  } else {
    EXPECT_EQ(info.rtr_role, static_cast<std::uint32_t>(SIWX_RTR_ROLE_AWAIT)) << end;
    EXPECT_EQ(info.rtr_mask, e.reply_rtr_mask) << end;
  }
  EXPECT_EQ(info.large_fpdus, e.large_fpdus ? 1u : 0u) << end;
  EXPECT_EQ(info.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_NONE)) << end;
}

TEST_P(CmInterop, NegotiatesByTheRulesAndMovesData) {
  const Cell& cell = GetParam();
  const Expected expected = ExpectedResult(cell);
  const auto initiator_options = [&](siwx_cm_mpa_options& o) {
    o.dialect = cell.initiator.dialect;
    o.peer_to_peer = cell.initiator.peer_to_peer ? 1 : 0;
    o.rtr_mask = cell.initiator.rtr_mask;
    ApplyPolicy(o, (cell.crc & kInitiatorOnly) != 0, (cell.markers & kInitiatorOnly) != 0);
    if ((cell.large_fpdus & kInitiatorOnly) != 0) o.large_fpdus = 1;
  };
  const auto responder_options = [&](siwx_cm_mpa_options& o) {
    o.dialect = cell.responder.dialect;
    o.rtr_mask = cell.responder.rtr_mask;
    ApplyPolicy(o, (cell.crc & kResponderOnly) != 0, (cell.markers & kResponderOnly) != 0);
    if ((cell.large_fpdus & kResponderOnly) != 0) o.large_fpdus = 1;
  };

  Listener listener;
  listener.Start(8, [&](rdma_cm_id* id) { SetOptions(id, responder_options); });
  Client client;
  client.Resolve(listener.port, [&](rdma_cm_id* id) { SetOptions(id, initiator_options); });
  ASSERT_NE(client.id->verbs, nullptr);

  ibv_qp_init_attr attr = QpAttr();
  ASSERT_EQ(rdma_create_qp(client.id, nullptr, &attr), 0) << "errno " << errno;
  ibv_qp* iqp = client.id->qp;
  Buffer i_send, i_write, i_read, i_recv;
  i_send.Register(client.id->pd, kSendLen, IBV_ACCESS_LOCAL_WRITE);
  i_write.Register(client.id->pd, kWriteLen, IBV_ACCESS_LOCAL_WRITE);
  // The sink of a Read is the target of tagged Read Responses: iWARP
  // needs it remotely writable (RFC 5040 4.4).
  i_read.Register(client.id->pd, kReadLen, kRemoteAccess);
  i_recv.Register(client.id->pd, kReplyLen + 64, IBV_ACCESS_LOCAL_WRITE);
  PostRecv(iqp, i_recv, 21);

  // Distinct data for every cell and operation.
  const std::uint32_t seed = static_cast<std::uint32_t>(
      std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  Fill(i_send.data, seed + 1);
  Fill(i_write.data, seed + 2);

  ASSERT_EQ(client.Connect(Ascii("interop"), /*resp_res=*/1, /*init_depth=*/1), 0);

  if (expected.outcome == Outcome::kResponderCloses) {
    EXPECT_EQ(Expect(client.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNRESET);
    EXPECT_FALSE(NextEvent(listener.channel, 50ms).has_value());
    const siwx_cm_conn_info ci = Info(client.id);
    EXPECT_EQ(ci.dialect, 0u);
    EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_CONNECTION_CLOSED));
    rdma_destroy_qp(client.id);
    return;
  }

  const EventCopy request = Expect(listener.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(request.id, nullptr);
  EXPECT_EQ(request.private_data, Ascii("interop"));
  rdma_cm_id* responder = request.id;
  ibv_qp_init_attr rattr = QpAttr();
  ASSERT_EQ(rdma_create_qp(responder, nullptr, &rattr), 0) << "errno " << errno;
  ibv_qp* rqp = responder->qp;
  Buffer r_recv, r_write, r_read, r_reply;
  r_recv.Register(responder->pd, kSendLen + 64, IBV_ACCESS_LOCAL_WRITE);
  r_write.Register(responder->pd, kWriteLen, kRemoteAccess);
  r_read.Register(responder->pd, kReadLen, kRemoteAccess);
  r_reply.Register(responder->pd, kReplyLen, IBV_ACCESS_LOCAL_WRITE);
  Fill(r_read.data, seed + 3);
  Fill(r_reply.data, seed + 4);
  PostRecv(rqp, r_recv, 11);
  rdma_conn_param accept{};
  accept.responder_resources = 1;
  accept.initiator_depth = 1;
  ASSERT_EQ(rdma_accept(responder, &accept), 0);
  Expect(listener.channel, RDMA_CM_EVENT_ESTABLISHED);

  const auto teardown = [&] {
    rdma_destroy_qp(responder);
    EXPECT_EQ(rdma_destroy_id(responder), 0);
    rdma_destroy_qp(client.id);
  };

  if (expected.outcome == Outcome::kNoCommonRtr) {
    const EventCopy failed = Expect(client.channel, RDMA_CM_EVENT_CONNECT_ERROR);
    EXPECT_EQ(failed.status, -EPROTO);
    const siwx_cm_conn_info ci = Info(client.id);
    EXPECT_EQ(ci.mpa_error, 7u);  // RFC 6581 9.2: no matching RTR option
    EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_NO_MATCHING_RTR));
    EXPECT_EQ(ci.rtr_mask, 0u) << "nothing negotiated on a failed startup";
    ExpectNegotiated(Info(responder), expected, /*initiator=*/false);
    // The Terminate and close end the accepted connection.
    Expect(listener.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
    teardown();
    return;
  }

  Expect(client.channel, RDMA_CM_EVENT_ESTABLISHED);
  ExpectNegotiated(Info(client.id), expected, /*initiator=*/true);
  ExpectNegotiated(Info(responder), expected, /*initiator=*/false);
  EXPECT_EQ(Info(client.id).stream_bound, 1u);
  EXPECT_EQ(Info(responder).stream_bound, 1u);

  // Write, then Send: the Send's arrival means the Write was placed
  // (RFC 5040 5.5 ordering). Then a Read of the Responder's buffer, and a
  // Send the other way.
  PostSend(iqp, IBV_WR_RDMA_WRITE, i_write, kWriteLen, 1, r_write.addr(), r_write.mr->rkey);
  PostSend(iqp, IBV_WR_SEND, i_send, kSendLen, 2);
  PostSend(iqp, IBV_WR_RDMA_READ, i_read, kReadLen, 3, r_read.addr(), r_read.mr->rkey);
  ExpectCompletion(client.id->send_cq, 1, IBV_WC_RDMA_WRITE, "RDMA Write");
  ExpectCompletion(client.id->send_cq, 2, IBV_WC_SEND, "Send");
  ExpectCompletion(client.id->send_cq, 3, IBV_WC_RDMA_READ, "RDMA Read");
  ExpectReceive(responder->recv_cq, 11, kSendLen, "Send at the Responder");
  EXPECT_EQ(FirstMismatch(r_recv.data.data(), kSendLen, seed + 1), -1) << "Send data";
  EXPECT_EQ(FirstMismatch(r_write.data.data(), kWriteLen, seed + 2), -1) << "Write data";
  EXPECT_EQ(FirstMismatch(i_read.data.data(), kReadLen, seed + 3), -1) << "Read data";

  PostSend(rqp, IBV_WR_SEND, r_reply, kReplyLen, 4);
  ExpectCompletion(responder->send_cq, 4, IBV_WC_SEND, "Send from the Responder");
  ExpectReceive(client.id->recv_cq, 21, kReplyLen, "Send at the Initiator");
  EXPECT_EQ(FirstMismatch(i_recv.data.data(), kReplyLen, seed + 4), -1) << "reply data";

  // Nothing else completed: the RTR (a zero-length message) is absorbed.
  ibv_wc extra{};
  EXPECT_EQ(ibv_poll_cq(responder->recv_cq, 1, &extra), 0);
  EXPECT_EQ(ibv_poll_cq(responder->send_cq, 1, &extra), 0);
  EXPECT_EQ(ibv_poll_cq(client.id->recv_cq, 1, &extra), 0);
  EXPECT_EQ(ibv_poll_cq(client.id->send_cq, 1, &extra), 0);

  ASSERT_EQ(rdma_disconnect(client.id), 0);
  Expect(client.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
  Expect(listener.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
  teardown();
}

INSTANTIATE_TEST_SUITE_P(Matrix, CmInterop, ::testing::ValuesIn(AllCells()), CellName);

// ---- The documented refusals (README: SIWX_MPA_CRC, SIWX_MPA_MARKERS) ----

struct RefusalCell {
  const char* name;
  siwx_mpa_dialect dialect;  // both ends
  bool markers;              // the policy at stake: markers, else CRC
  bool initiator_refuses;    // else the Responder refuses what the Initiator requires
};

std::string RefusalName(const ::testing::TestParamInfo<RefusalCell>& info) {
  return info.param.name;
}

class CmInteropRefusal : public NeedsDevices<RefusalCell> {};

TEST_P(CmInteropRefusal, EndsAsDocumented) {
  const RefusalCell& cell = GetParam();
  const auto policy = [&](siwx_cm_mpa_options& o, siwx_cm_policy p) {
    o.dialect = cell.dialect;
    (cell.markers ? o.markers : o.crc) = p;
  };
  const siwx_cm_policy initiator = cell.initiator_refuses ? SIWX_CM_POLICY_REFUSE : SIWX_CM_POLICY_REQUIRE;
  const siwx_cm_policy responder = cell.initiator_refuses ? SIWX_CM_POLICY_REQUIRE : SIWX_CM_POLICY_REFUSE;
  Listener listener;
  listener.Start(8, [&](rdma_cm_id* id) {
    SetOptions(id, [&](siwx_cm_mpa_options& o) { policy(o, responder); });
  });
  Client client;
  client.Resolve(listener.port, [&](rdma_cm_id* id) {
    SetOptions(id, [&](siwx_cm_mpa_options& o) { policy(o, initiator); });
  });
  ibv_qp_init_attr attr = QpAttr();
  ASSERT_EQ(rdma_create_qp(client.id, nullptr, &attr), 0) << "errno " << errno;
  ASSERT_EQ(client.Connect({}, 1, 1), 0);
  const std::uint32_t failure =
      cell.markers ? SIWX_CM_FAILURE_MARKERS_REFUSED : SIWX_CM_FAILURE_CRC_REFUSED;
  if (!cell.initiator_refuses) {
    // The Responder rejects (R = 1) before the application sees a request.
    EXPECT_EQ(Expect(client.channel, RDMA_CM_EVENT_REJECTED).status, -ECONNREFUSED);
    EXPECT_FALSE(NextEvent(listener.channel, 50ms).has_value());
    const siwx_cm_conn_info ci = Info(client.id);
    EXPECT_EQ(ci.dialect, 0u);
    EXPECT_EQ(ci.failure_code, static_cast<std::uint32_t>(SIWX_CM_FAILURE_REJECTED));
  } else {
    const EventCopy request = Expect(listener.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(request.id, nullptr);
    ibv_qp_init_attr rattr = QpAttr();
    ASSERT_EQ(rdma_create_qp(request.id, nullptr, &rattr), 0) << "errno " << errno;
    ASSERT_EQ(rdma_accept(request.id, nullptr), 0);
    EXPECT_EQ(Expect(client.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -EPROTO);
    const siwx_cm_conn_info ci = Info(client.id);
    EXPECT_EQ(ci.dialect, 0u);
    EXPECT_EQ(ci.failure_code, failure);
    if (cell.dialect == SIWX_MPA_DIALECT_V1_RTR) {
      // The proposal's Responder is established only by the Rtr frame,
      // which never comes: the close fails its startup.
      EXPECT_EQ(Expect(listener.channel, RDMA_CM_EVENT_CONNECT_ERROR).status, -ECONNRESET);
    } else {
      // Established by its own Reply; the close ends the connection.
      Expect(listener.channel, RDMA_CM_EVENT_ESTABLISHED);
      Expect(listener.channel, RDMA_CM_EVENT_DISCONNECTED, 5000ms);
    }
    rdma_destroy_qp(request.id);
    EXPECT_EQ(rdma_destroy_id(request.id), 0);
  }
  rdma_destroy_qp(client.id);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, CmInteropRefusal,
    ::testing::Values(
        RefusalCell{"V1_CrcRefusedByResponder", SIWX_MPA_DIALECT_V1, false, false},
        RefusalCell{"V1_CrcRefusedByInitiator", SIWX_MPA_DIALECT_V1, false, true},
        RefusalCell{"V1_MarkersRefusedByResponder", SIWX_MPA_DIALECT_V1, true, false},
        RefusalCell{"V1_MarkersRefusedByInitiator", SIWX_MPA_DIALECT_V1, true, true},
        RefusalCell{"V1Rtr_CrcRefusedByResponder", SIWX_MPA_DIALECT_V1_RTR, false, false},
        RefusalCell{"V1Rtr_CrcRefusedByInitiator", SIWX_MPA_DIALECT_V1_RTR, false, true},
        RefusalCell{"V1Rtr_MarkersRefusedByResponder", SIWX_MPA_DIALECT_V1_RTR, true, false},
        RefusalCell{"V1Rtr_MarkersRefusedByInitiator", SIWX_MPA_DIALECT_V1_RTR, true, true},
        RefusalCell{"V2_CrcRefusedByResponder", SIWX_MPA_DIALECT_V2, false, false},
        RefusalCell{"V2_CrcRefusedByInitiator", SIWX_MPA_DIALECT_V2, false, true},
        RefusalCell{"V2_MarkersRefusedByResponder", SIWX_MPA_DIALECT_V2, true, false},
        RefusalCell{"V2_MarkersRefusedByInitiator", SIWX_MPA_DIALECT_V2, true, true}),
    RefusalName);

}  // namespace
}  // namespace siwx::cm::test
