// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Stress: kQpPairs QP pairs over loopback TCP between two engines (as two
// processes would have them), each pair carrying a flow in each direction:
// Sends, RDMA Writes and RDMA Reads of sizes 0 .. 256 KiB with SGE lists
// and inline data, CRC on half of the streams, markers on a third, and
// max ULPDUs from 128 octets to large FPDUs. Several application threads
// post and poll at once.
//
// Checked exactly: every completion of every QP (no lost, no duplicate, in
// WR order, every field), every octet of every target slice and of the gaps
// between them, no async event, every QP still in RTS, and each direction's
// octet count equal at both ends. The plan (operations, sizes, SGE splits,
// flags) is a function of the seed, printed with every failure; set
// SIWX_STRESS_SEED to replay one.
#include <gtest/gtest.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

// ---- Size of the run (about 3 s under ASan on two cores) ----
constexpr std::size_t kQpPairs = 64;
constexpr std::size_t kMessagesPerFlow = 24;  // two flows per pair: 64 * 2 * 24 = 3072 messages
constexpr std::size_t kMaxMessage = 256 * 1024;
constexpr std::size_t kAppThreads = 4;
constexpr std::uint64_t kDefaultSeed = 0x51'57'58'01;
constexpr std::chrono::seconds kDeadline{120};   // fails the test, never hangs it
constexpr std::chrono::seconds kWatchdog{240};   // aborts if teardown hangs

constexpr std::size_t kGap = 64;             // untouched octets after every slice
constexpr std::uint8_t kGapFill = 0x5A;
constexpr std::uint8_t kSinkFill = 0xC3;     // a sink slice before its data arrives
constexpr std::uint32_t kQueueDepth = 64;    // SQ, RQ (>= kMessagesPerFlow)
constexpr std::uint32_t kCqDepth = 128;

std::uint64_t StressSeed() {
  const char* s = std::getenv("SIWX_STRESS_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 0) : kDefaultSeed;
}

enum class Op : std::uint8_t { kSend, kWrite, kRead };

// One message of a flow. Its slice [offset, offset + size) exists in both
// buffers of the flow: the source holds the pattern from the start, the
// sink gets it from the message.
struct Message {
  Op op = Op::kSend;
  std::size_t size = 0;
  std::size_t offset = 0;
  std::size_t src_parts = 1;   // SGEs of the data source (Send, Write)
  std::size_t recv_parts = 1;  // SGEs of the receive WR (Send)
  std::size_t recv_slack = 0;  // receive room past the message, inside the gap
  bool signaled = true;
  bool fence = false;
  bool inline_data = false;
  std::uint32_t pattern = 0;   // PatternByte seed, unique per (flow, message)
};

// A pair's stream parameters: CRC on half, markers on a third, IRD/ORD 1..8,
// and max ULPDUs from the EMSS, 128 octets, an odd 1021, large FPDUs, 4096.
LinkOptions LinkFor(std::size_t pair) {
  LinkOptions o;
  o.crc = pair % 2 == 0;
  o.markers = pair % 3 == 0;
  o.ird = static_cast<std::uint32_t>(1 + pair % 8);
  o.ord = o.ird;
  switch (pair % 5) {
    case 1:
      o.max_ulpdu = kMinMaxUlpdu;
      break;
    case 2:
      o.max_ulpdu = 1021;
      break;
    case 3:
      o.large_fpdus = true;
      break;
    case 4:
      o.max_ulpdu = 4096;
      break;
    default:
      break;  // derived from the loopback EMSS
  }
  return o;
}

std::size_t PickSize(std::mt19937_64& rng) {
  const unsigned r = static_cast<unsigned>(rng() % 100);
  if (r < 8) return 0;
  if (r < 14) return 1;
  if (r < 44) return 2 + rng() % 299;              // within one small FPDU
  if (r < 74) return 301 + rng() % (8 * 1024);     // a few FPDUs
  if (r < 95) return 8 * 1024 + rng() % (24 * 1024);
  return 32 * 1024 + rng() % (kMaxMessage - 32 * 1024 + 1);
}

// The plan of flow `flow` (pair = flow / 2). Deterministic in the seed.
std::vector<Message> PlanFlow(std::uint64_t seed, std::size_t flow) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + flow);
  std::vector<Message> plan(kMessagesPerFlow);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    Message& m = plan[i];
    const bool last = i + 1 == plan.size();
    const unsigned r = static_cast<unsigned>(rng() % 100);
    m.op = r < 40 ? Op::kSend : r < 75 ? Op::kWrite : Op::kRead;
    m.size = PickSize(rng);
    if (i == 1) m.size = 0;
    if (i == 2) m.size = 1;
    if (i == 3 && flow % 4 == 0) m.size = kMaxMessage;
    // The last message is a signaled Send: its arrival says every Write
    // before it was placed (RFC 5040 5.5).
    if (last) {
      m.op = Op::kSend;
      m.size = 1 + rng() % 64;
    }
    m.src_parts = 1 + rng() % 3;
    m.recv_parts = 1 + rng() % 3;
    m.recv_slack = rng() % 17;
    m.signaled = last || rng() % 8 != 0;
    m.fence = !last && rng() % 10 == 0;
    m.inline_data = m.op != Op::kRead && m.size <= kMaxInlineData && rng() % 3 == 0;
    m.pattern = static_cast<std::uint32_t>(flow * kMessagesPerFlow + i + 1);
    m.offset = offset;
    offset += m.size + kGap;
  }
  return plan;
}

std::size_t PlanBytes(const std::vector<Message>& plan) {
  return plan.empty() ? 0 : plan.back().offset + plan.back().size + kGap;
}

WcOpcode WcOpcodeFor(Op op) {
  switch (op) {
    case Op::kSend:
      return WcOpcode::kSend;
    case Op::kWrite:
      return WcOpcode::kRdmaWrite;
    case Op::kRead:
      return WcOpcode::kRdmaRead;
  }
  return WcOpcode::kSend;
}

std::uint64_t SendWrId(std::size_t flow, std::size_t i) { return (std::uint64_t{flow} << 32) | i; }
std::uint64_t RecvWrId(std::size_t flow, std::size_t i) {
  return (std::uint64_t{1} << 63) | (std::uint64_t{flow} << 32) | i;
}

std::string Describe(const WorkCompletion& wc) {
  std::ostringstream s;
  s << "{wr_id 0x" << std::hex << wc.wr_id << std::dec << " status " << WcStatusName(wc.status)
    << " opcode " << static_cast<std::uint32_t>(wc.opcode) << " byte_len " << wc.byte_len
    << " qp " << wc.qp_num << " flags " << wc.wc_flags << " vendor " << wc.vendor_err << "}";
  return s.str();
}

bool SameCompletion(const WorkCompletion& a, const WorkCompletion& b) {
  return a.wr_id == b.wr_id && a.status == b.status && a.opcode == b.opcode &&
         a.byte_len == b.byte_len && a.qp_num == b.qp_num && a.wc_flags == b.wc_flags &&
         a.vendor_err == b.vendor_err && a.imm_data == b.imm_data &&
         a.invalidated_rkey == b.invalidated_rkey && a.src_qp == b.src_qp;
}

// One direction of one pair: `initiator` posts the plan, `responder` is its
// peer (Send/Write target, Read source).
struct Flow {
  std::size_t id = 0;
  Node* initiator = nullptr;
  Node* responder = nullptr;
  std::vector<Message> plan;
  std::unique_ptr<Buffer> ibuf;  // initiator side: Send/Write source, Read sink
  std::unique_ptr<Buffer> rbuf;  // responder side: Send/Write sink, Read source
  std::vector<std::uint8_t> expected;  // both buffers once every message is done
  std::uint32_t ikey = 0;
  std::uint32_t rkey = 0;
  std::size_t next_post = 0;
  std::vector<WorkCompletion> want_send;  // initiator's send CQ, in order
  std::vector<WorkCompletion> want_recv;  // responder's recv CQ, in order
  std::vector<WorkCompletion> got_send;
  std::vector<WorkCompletion> got_recv;
  std::string error;  // first posting failure
};

// PatternByte(seed, j) for j < kMaxMessage, computed once: the seed only
// adds a constant modulo 256, so one table serves every message (and keeps
// filling and checking tens of MiB cheap in unoptimised sanitizer builds).
const std::vector<std::uint8_t>& PatternBase() {
  static const std::vector<std::uint8_t> base = [] {
    std::vector<std::uint8_t> b(kMaxMessage);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = PatternByte(0, j);
    return b;
  }();
  return base;
}

void FillPattern(std::uint8_t* out, const Message& m) {
  const std::uint8_t add = static_cast<std::uint8_t>(PatternByte(m.pattern, 0) - PatternByte(0, 0));
  const std::uint8_t* base = PatternBase().data();
  for (std::size_t j = 0; j < m.size; ++j) out[j] = static_cast<std::uint8_t>(base[j] + add);
}

// Sources get the pattern, sinks kSinkFill, gaps kGapFill.
void Prepare(Flow& f) {
  const std::size_t bytes = PlanBytes(f.plan);
  f.expected.assign(bytes, kGapFill);
  for (const Message& m : f.plan) FillPattern(f.expected.data() + m.offset, m);
  f.ibuf = std::make_unique<Buffer>(bytes, kGapFill);
  f.rbuf = std::make_unique<Buffer>(bytes, kGapFill);
  for (const Message& m : f.plan) {
    const bool to_responder = m.op != Op::kRead;
    std::uint8_t* source = to_responder ? f.ibuf->data() : f.rbuf->data();
    std::uint8_t* sink = to_responder ? f.rbuf->data() : f.ibuf->data();
    std::memcpy(source + m.offset, f.expected.data() + m.offset, m.size);
    std::fill(sink + m.offset, sink + m.offset + m.size, kSinkFill);
  }
  f.ikey = f.ibuf->Register(f.initiator->memory(), f.initiator->pd, kAllRemote);
  f.rkey = f.rbuf->Register(f.responder->memory(), f.responder->pd, kAllRemote);

  const std::uint32_t iqp = f.initiator->qp->qp_num();
  const std::uint32_t rqp = f.responder->qp->qp_num();
  for (std::size_t i = 0; i < f.plan.size(); ++i) {
    const Message& m = f.plan[i];
    if (m.signaled) {
      WorkCompletion wc;
      wc.wr_id = SendWrId(f.id, i);
      wc.status = WcStatus::kSuccess;
      wc.opcode = WcOpcodeFor(m.op);
      wc.byte_len = static_cast<std::uint32_t>(m.size);
      wc.qp_num = iqp;
      f.want_send.push_back(wc);
    }
    if (m.op == Op::kSend) {
      WorkCompletion wc;
      wc.wr_id = RecvWrId(f.id, i);
      wc.status = WcStatus::kSuccess;
      wc.opcode = WcOpcode::kRecv;
      wc.byte_len = static_cast<std::uint32_t>(m.size);
      wc.qp_num = rqp;
      f.want_recv.push_back(wc);
    }
  }
}

// The receive WRs for every Send of the flow, in order, before anything is sent.
void PostReceives(Flow& f) {
  for (std::size_t i = 0; i < f.plan.size(); ++i) {
    const Message& m = f.plan[i];
    if (m.op != Op::kSend) continue;
    ReceiveWorkRequest rwr;
    rwr.wr_id = RecvWrId(f.id, i);
    AddSplitSges(rwr, f.rbuf->addr() + m.offset, m.size + m.recv_slack, f.rkey, m.recv_parts);
    const PostStatus s = f.responder->qp->PostRecv(rwr);
    if (s != PostStatus::kOk && f.error.empty()) {
      f.error = "PostRecv of message " + std::to_string(i) + " returned " +
                std::to_string(static_cast<int>(s));
    }
  }
}

SendWorkRequest MakeWr(const Flow& f, std::size_t i) {
  const Message& m = f.plan[i];
  std::uint32_t flags = (m.signaled ? kSendSignaled : 0u) | (m.fence ? kSendFence : 0u);
  SendWorkRequest wr;
  switch (m.op) {
    case Op::kSend:
      wr = MakeSend(SendWrId(f.id, i), SendOpcode::kSend, flags);
      break;
    case Op::kWrite:
      wr = MakeSend(SendWrId(f.id, i), SendOpcode::kRdmaWrite, flags);
      wr.rkey = f.rkey;
      wr.remote_addr = f.rbuf->addr() + m.offset;
      break;
    case Op::kRead:
      wr = MakeSend(SendWrId(f.id, i), SendOpcode::kRdmaRead, flags);
      AddSge(wr, f.ibuf->addr() + m.offset, static_cast<std::uint32_t>(m.size), f.ikey);
      wr.rkey = f.rkey;
      wr.remote_addr = f.rbuf->addr() + m.offset;
      return wr;
  }
  if (m.inline_data) {
    // Copied at post time, in src_parts pieces.
    std::vector<ByteSpan> pieces;
    const std::size_t step = std::max<std::size_t>(1, m.size / m.src_parts);
    for (std::size_t at = 0; at < m.size; at += step) {
      pieces.emplace_back(f.ibuf->data() + m.offset + at, std::min(step, m.size - at));
    }
    const bool copied = wr.CopyInline(pieces);
    EXPECT_TRUE(copied);
  } else {
    AddSplitSges(wr, f.ibuf->addr() + m.offset, m.size, f.ikey, m.src_parts);
  }
  return wr;
}

// Compares one CQ's completions with the plan; describes the first
// difference.
std::string CompareCompletions(const std::vector<WorkCompletion>& want,
                               const std::vector<WorkCompletion>& got) {
  const std::size_t n = std::min(want.size(), got.size());
  for (std::size_t k = 0; k < n; ++k) {
    if (!SameCompletion(want[k], got[k])) {
      return "completion " + std::to_string(k) + ": want " + Describe(want[k]) + " got " +
             Describe(got[k]);
    }
  }
  if (got.size() < want.size()) {
    return "lost: " + std::to_string(want.size() - got.size()) + " of " +
           std::to_string(want.size()) + " completions missing; next wanted " +
           Describe(want[got.size()]);
  }
  if (got.size() > want.size()) {
    return "extra: " + std::to_string(got.size() - want.size()) + " completions; first " +
           Describe(got[want.size()]);
  }
  return {};
}

// Both buffers of a finished flow: every slice holds its pattern (the
// source kept it, the sink received it), every gap is untouched.
std::string VerifyBuffers(const Flow& f) {
  for (const Buffer* b : {f.ibuf.get(), f.rbuf.get()}) {
    const char* which = b == f.ibuf.get() ? "initiator" : "responder";
    if (!b->GuardsIntact()) return std::string(which) + " buffer guards overwritten";
    if (b->size() != f.expected.size()) return "layout mismatch";
    if (std::memcmp(b->data(), f.expected.data(), b->size()) == 0) continue;
    std::size_t at = 0;
    while (b->data()[at] == f.expected[at]) ++at;
    for (std::size_t i = 0; i < f.plan.size(); ++i) {
      const Message& m = f.plan[i];
      if (at >= m.offset + m.size + kGap) continue;
      const bool in_gap = at >= m.offset + m.size;
      return std::string(which) + (in_gap ? " gap after" : "") + " message " + std::to_string(i) +
             " (op " + std::to_string(static_cast<int>(m.op)) + ", " + std::to_string(m.size) +
             " octets): octet +" + std::to_string(at - m.offset) + " is " +
             std::to_string(b->data()[at]) + ", want " + std::to_string(f.expected[at]);
    }
  }
  return {};
}

// The two sides' nodes and the flows between them, torn down in the order
// the engine needs whatever way the test leaves: regions first (their STags
// live in the engines), then the nodes that share an engine, then the two
// that own one.
struct Fleet {
  std::vector<std::unique_ptr<Node>> a, b;
  std::vector<Flow> flows;
  ~Fleet() {
    flows.clear();
    for (std::size_t p = a.size(); p-- > 0;) a[p].reset();
    for (std::size_t p = b.size(); p-- > 0;) b[p].reset();
  }
};

// Drives the flows of one application thread: posts in small batches and
// polls, until every completion arrived or the deadline passed.
void DriveFlows(std::vector<Flow*> flows, std::uint64_t seed, Clock::time_point deadline) {
  std::mt19937_64 rng(seed);
  for (Flow* f : flows) PostReceives(*f);
  std::array<WorkCompletion, 16> batch;
  auto poll_into = [&](CompletionQueue& cq, std::vector<WorkCompletion>& out) {
    bool any = false;
    for (;;) {
      const std::size_t n = cq.Poll(batch);
      if (n == 0) return any;
      out.insert(out.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
      any = true;
    }
  };
  for (;;) {
    bool progress = false;
    bool done = true;
    for (Flow* f : flows) {
      if (f->next_post < f->plan.size() && f->error.empty()) {
        const std::size_t k = std::min<std::size_t>(1 + rng() % 4, f->plan.size() - f->next_post);
        std::vector<SendWorkRequest> wrs;
        for (std::size_t i = 0; i < k; ++i) wrs.push_back(MakeWr(*f, f->next_post + i));
        std::size_t posted = 0;
        const PostStatus s = f->initiator->qp->PostSend(wrs, &posted);
        f->next_post += posted;
        if (s != PostStatus::kOk) {
          f->error = "PostSend at message " + std::to_string(f->next_post) + " returned " +
                     std::to_string(static_cast<int>(s));
        }
        progress = true;
      }
      // Each CQ belongs to one flow: the initiator's send CQ to this flow,
      // the responder's receive CQ to this flow.
      progress |= poll_into(*f->initiator->send_cq, f->got_send);
      progress |= poll_into(*f->responder->recv_cq, f->got_recv);
      if (f->error.empty() && (f->next_post < f->plan.size() ||
                               f->got_send.size() < f->want_send.size() ||
                               f->got_recv.size() < f->want_recv.size())) {
        done = false;
      }
    }
    if (done || Clock::now() > deadline) return;
    if (!progress) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

TEST(EngineStress, ManyQpPairsAcrossTwoEnginesOverTcp) {
  const std::uint64_t seed = StressSeed();
  SCOPED_TRACE("SIWX_STRESS_SEED=" + std::to_string(seed));
  Watchdog watchdog(kWatchdog, "EngineStress (SIWX_STRESS_SEED=" + std::to_string(seed) + ")");
  const std::size_t fds_before = OpenFdCount();
  const auto start = Clock::now();

  // The plan, and what it covers.
  std::vector<std::vector<Message>> plans;
  std::size_t total_messages = 0;
  std::size_t total_octets = 0;
  std::array<std::size_t, 3> per_op{};
  bool has_zero = false, has_one = false, has_max = false, has_multi_sge = false;
  for (std::size_t flow = 0; flow < 2 * kQpPairs; ++flow) {
    plans.push_back(PlanFlow(seed, flow));
    for (const Message& m : plans.back()) {
      ++total_messages;
      total_octets += m.size;
      ++per_op[static_cast<std::size_t>(m.op)];
      has_zero |= m.size == 0;
      has_one |= m.size == 1;
      has_max |= m.size == kMaxMessage;
      has_multi_sge |= !m.inline_data && m.op != Op::kRead && m.src_parts > 1 && m.size > 1;
    }
  }
  ASSERT_EQ(total_messages, 2 * kQpPairs * kMessagesPerFlow);
  ASSERT_TRUE(has_zero && has_one && has_max && has_multi_sge);
  ASSERT_GT(per_op[0], 0u);
  ASSERT_GT(per_op[1], 0u);
  ASSERT_GT(per_op[2], 0u);

  {
    NodeOptions options;
    options.sq_caps = QueueCaps{kQueueDepth, kMaxSge, kMaxInlineData};
    options.rq_caps = QueueCaps{kQueueDepth, kMaxSge, 0};
    options.cq_depth = kCqDepth;
    // Two engines, as two processes: side a's QPs on one, side b's on the
    // other. Node 0 of each side owns its engine (and its event log).
    Fleet fleet;
    auto& a = fleet.a;
    auto& b = fleet.b;
    auto& flows = fleet.flows;
    for (std::size_t p = 0; p < kQpPairs; ++p) {
      a.push_back(std::make_unique<Node>(options, p == 0 ? nullptr : a[0]->engine));
      b.push_back(std::make_unique<Node>(options, p == 0 ? nullptr : b[0]->engine));
      ASSERT_NE(a.back()->qp, nullptr);
      ASSERT_NE(b.back()->qp, nullptr);
    }
    ASSERT_NE(a[0]->engine, b[0]->engine);
    for (std::size_t p = 0; p < kQpPairs; ++p) {
      Link(*a[p], *b[p], Transport::kTcp, LinkFor(p));
      ASSERT_EQ(a[p]->qp->state(), QpState::kRts);
      ASSERT_EQ(b[p]->qp->state(), QpState::kRts);
    }

    flows.resize(2 * kQpPairs);
    for (std::size_t p = 0; p < kQpPairs; ++p) {
      for (std::size_t dir = 0; dir < 2; ++dir) {
        Flow& f = flows[2 * p + dir];
        f.id = 2 * p + dir;
        f.initiator = dir == 0 ? a[p].get() : b[p].get();
        f.responder = dir == 0 ? b[p].get() : a[p].get();
        f.plan = plans[f.id];
        Prepare(f);
        // The table-driven fill is PatternByte itself.
        for (const Message& m : f.plan) {
          for (std::size_t j = 0; j < std::min<std::size_t>(m.size, 1000); ++j) {
            ASSERT_EQ(f.expected[m.offset + j], PatternByte(m.pattern, j));
          }
        }
      }
    }

    const auto traffic_start = Clock::now();
    const auto deadline = traffic_start + kDeadline;
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < kAppThreads; ++t) {
      std::vector<Flow*> mine;
      for (std::size_t p = t; p < kQpPairs; p += kAppThreads) {
        mine.push_back(&flows[2 * p]);
        mine.push_back(&flows[2 * p + 1]);
      }
      threads.emplace_back(DriveFlows, mine, seed + t, deadline);
    }
    for (std::thread& t : threads) t.join();
    const auto traffic_done = Clock::now();

    std::size_t failed_flows = 0;
    for (Flow& f : flows) {
      SCOPED_TRACE("flow " + std::to_string(f.id) + " (pair " + std::to_string(f.id / 2) +
                   (f.id % 2 == 0 ? ", a->b)" : ", b->a)"));
      const std::string send = CompareCompletions(f.want_send, f.got_send);
      const std::string recv = CompareCompletions(f.want_recv, f.got_recv);
      EXPECT_EQ(f.error, "");
      EXPECT_EQ(send, "") << "initiator send CQ";
      EXPECT_EQ(recv, "") << "responder receive CQ";
      if (!send.empty() || !recv.empty() || !f.error.empty()) {
        ++failed_flows;
        continue;
      }
      EXPECT_EQ(VerifyBuffers(f), "");
      EXPECT_FALSE(f.initiator->send_cq->in_error());
      EXPECT_FALSE(f.responder->recv_cq->in_error());
    }
    ASSERT_EQ(failed_flows, 0u);

    // Nothing late or duplicated, no event, every stream still up, and every
    // octet one end wrote was read by the other (all traffic is answered:
    // the last Send of each flow follows every Write, each Read completed).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (std::size_t p = 0; p < kQpPairs; ++p) {
      SCOPED_TRACE("pair " + std::to_string(p));
      for (Node* n : {a[p].get(), b[p].get()}) {
        EXPECT_EQ(n->send_cq->size(), 0u);
        EXPECT_EQ(n->recv_cq->size(), 0u);
        EXPECT_EQ(n->qp->state(), QpState::kRts);
        const QpAttributes attr = n->qp->Query();
        EXPECT_FALSE(attr.terminate_sent.has_value());
        EXPECT_FALSE(attr.terminate_received.has_value());
        EXPECT_FALSE(attr.local_error.has_value());
        EXPECT_EQ(attr.sq_outstanding, 0u);
      }
      const QpCounters ca = a[p]->qp->Counters();
      const QpCounters cb = b[p]->qp->Counters();
      EXPECT_EQ(ca.tx_octets, cb.rx_octets);
      EXPECT_EQ(cb.tx_octets, ca.rx_octets);
      EXPECT_EQ(ca.tx_fpdus, cb.rx_fpdus);
      EXPECT_EQ(cb.tx_fpdus, ca.rx_fpdus);
    }
    EXPECT_TRUE(a[0]->events.Events().empty());
    EXPECT_TRUE(b[0]->events.Events().empty());

    auto ms = [](Clock::duration d) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    std::printf("[ stress   ] seed %" PRIu64 ": %zu QP pairs, %zu messages (%zu Send, %zu Write, "
                "%zu Read), %zu payload octets; setup %lld ms, traffic %lld ms, checks %lld ms\n",
                seed, kQpPairs, total_messages, per_op[0], per_op[1], per_op[2], total_octets,
                ms(traffic_start - start), ms(traffic_done - traffic_start),
                ms(Clock::now() - traffic_done));
  }
  EXPECT_EQ(OpenFdCount(), fds_before);
}

}  // namespace
}  // namespace siwx::engine::testing
