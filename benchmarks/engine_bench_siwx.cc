// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// engine_bench: the siwx runs (rows 2 and 4 of the table in engine_bench.cc):
// two Engines, one QP each, over one loopback TCP connection, as two
// processes would have them. The application thread posts and polls; the
// engines' progress threads do the rest. Each run joins what it starts.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_util.h"
#include "benchmarks/engine_bench.h"
#include "common/engine/completion.h"
#include "common/engine/engine.h"
#include "common/engine/memory.h"
#include "common/engine/qp.h"
#include "common/engine/stream_params.h"
#include "common/engine/work_request.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/fpdu.h"

namespace siwx::bench {

using engine::AccessFlags;
using engine::PostStatus;
using engine::SendOpcode;
using engine::SendWorkRequest;
using engine::WcStatus;
using engine::WorkCompletion;

namespace {

// ---------------------------------------------------------------------------
// siwx: two engines, one QP each, over one loopback TCP connection

// Wakes an application thread sleeping until an armed CQ fires (what a
// completion channel and ibv_get_cq_event do for a verbs program).
class CqWaiter {
 public:
  void Notify() {
    {
      std::lock_guard lock(mutex_);
      ++events_;
    }
    cv_.notify_one();
  }
  std::uint64_t events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  // Returns when events() has moved past `seen`, or after `timeout`.
  void WaitPast(std::uint64_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return events_ != seen; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t events_ = 0;  // guarded by mutex_
};

// One end: its own Engine (as a separate process would have), PD, CQs, QP.
struct Side {
  std::unique_ptr<engine::Engine> engine;
  engine::PdId pd = engine::kNoPd;
  std::unique_ptr<engine::CompletionQueue> send_cq;
  std::unique_ptr<engine::CompletionQueue> recv_cq;
  std::shared_ptr<engine::Qp> qp;
  std::atomic<int> async_events{0};
  std::atomic<std::uint32_t> last_event{0};
  std::vector<std::uint32_t> stags;
  CqWaiter send_waiter;  // notified when the armed send CQ fires

  // Registers [buf, buf + size) at TO = its address.
  std::optional<std::uint32_t> Register(PageBuffer& buf, AccessFlags access) {
    const engine::RegisterResult r =
        engine->memory().Register(pd, buf.addr(), buf.size(), buf.addr(), access);
    if (r.status != engine::RegisterStatus::kOk) return std::nullopt;
    stags.push_back(r.stag);
    return r.stag;
  }

  std::string Describe() const {
    if (!qp) return "no QP";
    const engine::QpAttributes a = qp->Query();
    std::ostringstream s;
    s << "qp " << a.qp_num << " state " << static_cast<int>(a.state)
      << " async_events " << async_events.load() << " (last type " << last_event.load() << ")";
    if (a.terminate_sent) s << " terminate_sent";
    if (a.terminate_received) s << " terminate_received";
    if (a.local_error) {
      s << " local_error " << int{a.local_error->layer} << "/" << int{a.local_error->etype} << "/"
        << int{a.local_error->ecode};
    }
    return s.str();
  }
};

class SiwxPair {
 public:
  // Both ends with the same parameters; false (with `error`) on failure.
  bool Create(const engine::StreamParams& params, std::uint32_t sq_depth,
              std::uint32_t max_inline, std::string* error) {
    for (Side* s : {&a_, &b_}) {
      engine::EngineConfig config;
      config.on_async_event = [s](const engine::AsyncEvent& e) {
        s->last_event.store(static_cast<std::uint32_t>(e.type));
        s->async_events.fetch_add(1);
      };
      s->engine = engine::Engine::Create(std::move(config));
      if (!s->engine) return Fail(error, "Engine::Create failed");
      s->pd = s->engine->memory().AllocatePd();
      engine::CompletionQueue::Callbacks send_callbacks;
      send_callbacks.on_completion = [s] { s->send_waiter.Notify(); };
      s->send_cq = engine::CompletionQueue::Create(sq_depth + 16, send_callbacks);
      s->recv_cq = engine::CompletionQueue::Create(64, {});
      if (!s->send_cq || !s->recv_cq) return Fail(error, "CQ create failed");
      engine::QpConfig qc;
      qc.pd = s->pd;
      qc.send_cq = s->send_cq.get();
      qc.recv_cq = s->recv_cq.get();
      qc.sq_caps = {sq_depth, 1, max_inline};
      qc.rq_caps = {16, 1, 0};
      s->qp = s->engine->CreateQp(qc);
      if (!s->qp) return Fail(error, "CreateQp failed");
      if (s->qp->Modify(engine::QpState::kInit) != engine::QpStatus::kOk) {
        return Fail(error, "Modify(INIT) failed");
      }
    }
    const std::array<int, 2> fds = ConnectLoopback();
    if (fds[0] < 0) return Fail(error, "connect failed");
    if (a_.qp->Bind(std::make_unique<transport::TcpStream>(fds[0]), params) !=
        engine::BindStatus::kOk) {
      close(fds[1]);
      return Fail(error, "Bind a failed");
    }
    if (b_.qp->Bind(std::make_unique<transport::TcpStream>(fds[1]), params) !=
        engine::BindStatus::kOk) {
      return Fail(error, "Bind b failed");
    }
    return true;
  }

  ~SiwxPair() {
    // QPs first (no engine thread touches buffers or CQs afterwards), then
    // the engines; CQs and buffers outlive both.
    for (Side* s : {&a_, &b_}) {
      if (s->qp) s->qp->Destroy();
    }
    for (Side* s : {&a_, &b_}) {
      if (s->engine) {
        for (std::uint32_t stag : s->stags) s->engine->memory().Deregister(stag);
      }
      s->qp.reset();
      s->engine.reset();
    }
  }

  Side& a() { return a_; }
  Side& b() { return b_; }

  std::string Describe() const { return "a: " + a_.Describe() + "; b: " + b_.Describe(); }

 private:
  static bool Fail(std::string* error, const char* what) {
    *error = what;
    return false;
  }

  Side a_;
  Side b_;
};

// Waits for `n` completions on `cq`; false on timeout or a failed one.
bool AwaitCompletions(engine::CompletionQueue& cq, std::size_t n, std::string* error) {
  const auto deadline = Clock::now() + kStallTimeout;
  std::array<WorkCompletion, 16> wcs;
  while (n > 0) {
    const std::size_t got = cq.Poll(std::span<WorkCompletion>(wcs.data(), std::min(n, wcs.size())));
    for (std::size_t i = 0; i < got; ++i) {
      if (wcs[i].status != WcStatus::kSuccess) {
        *error = "completion " + std::to_string(wcs[i].wr_id) + " failed: " +
                 std::string(engine::WcStatusName(wcs[i].status));
        return false;
      }
    }
    n -= got;
    if (got == 0 && Clock::now() > deadline) {
      *error = "timed out waiting for a completion";
      return false;
    }
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// 2. siwx RDMA Write (or Read) stream

BwResult RunSiwxStream(const Options& o, const BwConfig& bc, std::uint32_t seed) {
  engine::StreamParams params;
  params.crc_enabled = bc.crc;
  params.large_fpdus = bc.mulpdu == MulpduChoice::kLarge;
  if (bc.mulpdu == MulpduChoice::kEthernet) params.max_ulpdu = mpa::Mulpdu(kEthernetEmss, false);
  if (bc.read) {
    // What ib_read_bw negotiates on siwx: enough for the whole window.
    params.ird = static_cast<std::uint32_t>(o.window);
    params.ord = static_cast<std::uint32_t>(o.window);
  }

  PageBuffer src(o.msg_size);
  PageBuffer dst(o.msg_size);
  FillPattern(src, seed, 0);
  SiwxPair pair;
  std::string error;
  // Two extra slots: the fence Write and the final Write + Send.
  if (!pair.Create(params, o.window + 4, 0, &error)) return Failed(error);
  Side& a = pair.a();
  Side& b = pair.b();
  SendWorkRequest wr;
  wr.num_sge = 1;
  if (bc.read) {
    // a reads b's `src` into its own `dst`.
    const auto src_key = b.Register(src, AccessFlags::kLocalWrite | AccessFlags::kRemoteRead);
    const auto dst_key = a.Register(dst, AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
    if (!src_key || !dst_key) return Failed("Register failed");
    wr.opcode = SendOpcode::kRdmaRead;
    wr.sge[0] = engine::Sge{dst.addr(), static_cast<std::uint32_t>(o.msg_size), *dst_key};
    wr.remote_addr = src.addr();
    wr.rkey = *src_key;
  } else {
    const auto src_key = a.Register(src, AccessFlags::kLocalWrite);
    const auto dst_key = b.Register(dst, AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
    if (!src_key || !dst_key) return Failed("Register failed");
    wr.opcode = SendOpcode::kRdmaWrite;
    wr.sge[0] = engine::Sge{src.addr(), static_cast<std::uint32_t>(o.msg_size), *src_key};
    wr.remote_addr = dst.addr();
    wr.rkey = *dst_key;
  }

  std::uint64_t posted = 0;     // WRs posted
  std::uint64_t completed = 0;  // WRs known complete (a signaled one retires all before it)
  std::array<WorkCompletion, 32> wcs;
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o.warmup));
  const auto measure_to = measure_from + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o.seconds));
  std::optional<CpuSnapshot> c0;
  CpuSnapshot c1;
  double app0 = 0, app1 = 0;
  std::uint64_t completed0 = 0, completed1 = 0;
  engine::QpCounters tx0{}, rx0{}, tx1{}, rx1{};
  auto last_progress = start;
  for (;;) {
    while (posted - completed < o.window) {
      wr.wr_id = posted;
      wr.flags = (posted + 1) % o.signal_every == 0 ? std::uint32_t{engine::kSendSignaled} : 0u;
      const PostStatus st = a.qp->PostSend(wr);
      if (st != PostStatus::kOk) {
        return Failed("PostSend returned " + std::to_string(static_cast<int>(st)) + "; " +
                      pair.Describe());
      }
      ++posted;
    }
    const std::size_t got = a.send_cq->Poll(std::span<WorkCompletion>(wcs));
    for (std::size_t i = 0; i < got; ++i) {
      if (wcs[i].status != WcStatus::kSuccess) {
        return Failed(std::string(bc.read ? "Read " : "Write ") + std::to_string(wcs[i].wr_id) + " completed with " +
                      std::string(engine::WcStatusName(wcs[i].status)) + "; " + pair.Describe());
      }
      completed = wcs[i].wr_id + 1;
    }
    const auto now = Clock::now();
    if (got > 0) {
      last_progress = now;
    } else {
      if (o.progress_in_poll) a.qp->ProgressSend();
      if (o.use_event) {
        // Arm, then look again: entries queued before the arm do not fire.
        const std::uint64_t seen = a.send_waiter.events();
        a.send_cq->Arm(engine::CqArm::kNextCompletion);
        if (a.send_cq->size() == 0) a.send_waiter.WaitPast(seen, std::chrono::milliseconds(100));
      }
      if (now - last_progress > kStallTimeout) return Failed("stalled; " + pair.Describe());
    }
    if (!c0 && now >= measure_from) {
      c0 = TakeCpuSnapshot();
      app0 = ThreadCpuSeconds();
      completed0 = completed;
      tx0 = (bc.read ? b : a).qp->Counters();
      rx0 = (bc.read ? a : b).qp->Counters();
    }
    if (now >= measure_to) {
      c1 = TakeCpuSnapshot();
      app1 = ThreadCpuSeconds();
      completed1 = completed;
      tx1 = (bc.read ? b : a).qp->Counters();
      rx1 = (bc.read ? a : b).qp->Counters();
      break;
    }
  }

  // Fence: a signaled WR behind everything, so no WR reads `src` (or, for
  // Reads, writes `dst`) any more.
  wr.wr_id = posted++;
  wr.flags = engine::kSendSignaled;
  if (a.qp->PostSend(wr) != PostStatus::kOk) return Failed("fence PostSend failed");
  {
    const auto deadline = Clock::now() + kStallTimeout;
    while (completed < posted) {
      const std::size_t got = a.send_cq->Poll(std::span<WorkCompletion>(wcs));
      for (std::size_t i = 0; i < got; ++i) {
        if (wcs[i].status != WcStatus::kSuccess) return Failed("drain: a WR failed");
        completed = wcs[i].wr_id + 1;
      }
      if (got == 0 && Clock::now() > deadline) return Failed("drain stalled; " + pair.Describe());
    }
  }
  FillPattern(src, seed, 0xFF);
  if (bc.read) {
    // No Read reads `src` any more: one more Read must bring the last pattern.
    wr.wr_id = posted++;
    if (a.qp->PostSend(wr) != PostStatus::kOk) return Failed("final Read post failed");
    if (!AwaitCompletions(*a.send_cq, 1, &error)) return Failed("final: " + error);
  } else {
    // The last pattern, then a Send behind it: once it is received, the
    // Write before it is placed (RFC 5040 5.5).
    engine::ReceiveWorkRequest rwr;
    rwr.wr_id = 1;
    if (b.qp->PostRecv(rwr) != PostStatus::kOk) return Failed("PostRecv failed");
    wr.wr_id = posted++;
    if (a.qp->PostSend(wr) != PostStatus::kOk) return Failed("final Write post failed");
    SendWorkRequest send;
    send.wr_id = posted++;
    send.opcode = SendOpcode::kSend;
    send.flags = engine::kSendSignaled;
    if (a.qp->PostSend(send) != PostStatus::kOk) return Failed("final Send post failed");
    if (!AwaitCompletions(*a.send_cq, 2, &error)) return Failed("final: " + error);
    if (!AwaitCompletions(*b.recv_cq, 1, &error)) return Failed("final receive: " + error);
  }
  if (const auto bad = FirstMismatch(dst, seed, 0xFF)) {
    return Failed("DATA MISMATCH at octet " + std::to_string(*bad) + " of the target");
  }
  if (a.async_events.load() != 0 || b.async_events.load() != 0) {
    return Failed("async event; " + pair.Describe());
  }

  BwResult r;
  if (!c0) return Failed("measurement window never opened");
  const CpuUse cpu = CpuBetween(*c0, c1);
  const double msgs = static_cast<double>(completed1 - completed0);
  const double bytes = msgs * static_cast<double>(o.msg_size);
  if (msgs <= 0) return Failed("no WR completed in the window");
  r.ok = true;
  r.gbps = bytes * 8 / cpu.wall_s / 1e9;
  r.cpu_s_per_gb = cpu.own_cpu_s / (bytes / 1e9);
  r.cpu_us_per_msg = cpu.own_cpu_s * 1e6 / msgs;
  r.cores = cpu.own_cpu_s / cpu.wall_s;
  r.app_cores = (app1 - app0) / cpu.wall_s;
  r.switches_per_msg = cpu.context_switches / msgs;
  r.foreign_cores = cpu.foreign_cores;
  r.max_ulpdu = a.qp->Query().max_ulpdu;
  const auto d = [](std::uint64_t x, std::uint64_t y) { return static_cast<double>(y - x); };
  const double tx_fpdus = d(tx0.tx_fpdus, tx1.tx_fpdus);
  const double rx_fpdus = d(rx0.rx_fpdus, rx1.rx_fpdus);
  const double staged = d(rx0.rx_staged_payload, rx1.rx_staged_payload);
  const double direct = d(rx0.rx_direct_payload, rx1.rx_direct_payload);
  r.fpdus_per_msg = tx_fpdus / msgs;
  r.fpdus_per_sendmsg = tx_fpdus / std::max(1.0, d(tx0.tx_syscalls, tx1.tx_syscalls));
  r.tx_would_block_per_msg = d(tx0.tx_would_block, tx1.tx_would_block) / msgs;
  r.rx_syscalls_per_fpdu = d(rx0.rx_syscalls, rx1.rx_syscalls) / std::max(1.0, rx_fpdus);
  r.rx_staged_fraction = staged / std::max(1.0, staged + direct);
  return r;
}

// ---------------------------------------------------------------------------
// 4. siwx 8 B RDMA Write ping-pong (ib_write_lat)

LatResult RunSiwxPingPong(const Options& o, bool crc) {
  engine::StreamParams params;
  params.crc_enabled = crc;
  SiwxPair pair;
  std::string error;
  if (!pair.Create(params, 16, kLatencySize, &error)) return LatFailed(error);
  PageBuffer buf_a(kLatencySize);
  PageBuffer buf_b(kLatencySize);
  const AccessFlags access = AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite;
  const auto key_a = pair.a().Register(buf_a, access);
  const auto key_b = pair.b().Register(buf_b, access);
  if (!key_a || !key_b) return LatFailed("Register failed");

  std::atomic<bool> abort{false};
  std::string errors[2];  // one per thread

  // Posts the inline Write of `v` into the peer's buffer and waits for its
  // send completion, as ib_write_lat does after every post.
  auto post = [&](int side, Side& s, std::uint64_t peer_addr, std::uint32_t rkey, std::uint8_t v) {
    SendWorkRequest wr;
    wr.wr_id = v;
    wr.opcode = SendOpcode::kRdmaWrite;
    wr.flags = engine::kSendSignaled | engine::kSendInline;
    wr.inline_length = kLatencySize;
    wr.inline_data[kLatencySize - 1] = v;
    wr.remote_addr = peer_addr;
    wr.rkey = rkey;
    const PostStatus st = s.qp->PostSend(wr);
    if (st != PostStatus::kOk) {
      errors[side] = "PostSend returned " + std::to_string(static_cast<int>(st));
      abort.store(true);
      return false;
    }
    std::array<WorkCompletion, 1> wc;
    const auto stall_at = Clock::now() + kStallTimeout;
    std::uint32_t spins = 0;
    while (s.send_cq->Poll(std::span<WorkCompletion>(wc)) == 0) {
      if ((++spins & 0xFFF) == 0 &&
          (abort.load(std::memory_order_relaxed) || Clock::now() > stall_at)) {
        errors[side] = "no send completion";
        abort.store(true);
        return false;
      }
    }
    if (wc[0].status != WcStatus::kSuccess) {
      errors[side] = "Write completed with " + std::string(engine::WcStatusName(wc[0].status));
      abort.store(true);
      return false;
    }
    return true;
  };

  const CpuSnapshot c0 = TakeCpuSnapshot();
  LatencyRun run(o);
  // Spins on the last octet of `own` until the peer's Write put `want` there.
  auto spin = [&](int side, PageBuffer& own, std::uint8_t want) {
    std::uint8_t& last = own.data()[kLatencySize - 1];
    const auto stall_at = Clock::now() + kStallTimeout;
    std::uint32_t spins = 0;
    while (SpinLoad(last) != want) {
      if ((++spins & 0xFFF) != 0) continue;
      if (run.finished()) return false;
      if (abort.load(std::memory_order_relaxed) || Clock::now() > stall_at) {
        if (errors[side].empty()) errors[side] = "the peer's Write never arrived";
        abort.store(true);
        return false;
      }
    }
    return true;
  };

  std::thread server([&] {
    for (std::size_t i = 0; i < run.total(); ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      if (!spin(1, buf_b, v) || !post(1, pair.b(), buf_a.addr(), *key_a, v)) return;
    }
  });
  for (std::size_t i = 0; i < run.total() && run.Begin(i); ++i) {
    const auto v = static_cast<std::uint8_t>(i + 1);
    if (!post(0, pair.a(), buf_b.addr(), *key_b, v) || !spin(0, buf_a, v)) break;
    run.Done(i);
  }
  run.Finish();
  server.join();
  const CpuSnapshot c1 = TakeCpuSnapshot();
  if (abort.load()) {
    return LatFailed("client: " + errors[0] + "; server: " + errors[1] + "; " + pair.Describe());
  }
  if (pair.a().async_events.load() != 0 || pair.b().async_events.load() != 0) {
    return LatFailed("async event; " + pair.Describe());
  }
  return LatFromTimestamps(run.Timestamps(), Warmup(o), CpuBetween(c0, c1));
}

}  // namespace siwx::bench
