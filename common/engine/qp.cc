// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/qp.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <new>
#include <thread>
#include <utility>

#include "common/engine/engine.h"
#include "common/transport/endpoints.h"
#include "common/transport/socket_ops.h"
#include "common/util/log.h"

namespace siwx::engine {
namespace {

// The QP whose transmit gate this thread holds (innermost), so that calls
// made from inside a pump (callbacks) never wait for the progress thread,
// which may itself be waiting for this gate.
thread_local const Qp* tls_tx_owner = nullptr;
// The QP whose receive side this application thread is driving from a poll
// (DriveFromPoll): Destroy and Modify from a callback inside it must not
// wait for the progress thread, which may be waiting for its rx_mutex_.
thread_local const Qp* tls_rx_driver = nullptr;

bool InsideEngineTurn() { return tls_tx_owner != nullptr || tls_rx_driver != nullptr; }

const char* OnOff(bool on) { return on ? "on" : "off"; }

const char* RtrLabel(const StreamParams& p) {
  switch (p.rtr_role) {
    case RtrRole::kNone: return p.await_first_fpdu ? "no RTR, awaits the first FPDU" : "no RTR";
    case RtrRole::kSend:
      switch (p.rtr_message) {
        case RtrMessage::kSend: return "sends a Send RTR";
        case RtrMessage::kWrite: return "sends a Write RTR";
        case RtrMessage::kRead: return "sends a Read RTR";
      }
      return "sends an RTR";
    case RtrRole::kAwait: return "awaits the RTR";
  }
  return "?";
}

// One info line per stream with what it negotiated: an operator reading a
// log of a failed job sees how each QP was connected.
void LogBound(std::uint32_t qp_num, int fd, const StreamParams& p, std::size_t max_ulpdu) {
  if (!log::Enabled(log::Level::kInfo)) return;
  const transport::Endpoints ends = transport::QueryEndpoints(fd);
  SIWX_QP_LOG(kInfo, qp_num,
              "connected %s -> %s: %s, Rev %u, CRC %s, markers tx %s rx %s, large FPDUs %s, "
              "IRD %u ORD %u, max ULPDU %zu, %s",
              transport::FormatEndpoint(ends.local).c_str(),
              transport::FormatEndpoint(ends.peer).c_str(), MpaDialectLabel(p.mpa_dialect),
              static_cast<unsigned>(p.mpa_revision), OnOff(p.crc_enabled), OnOff(p.tx_markers),
              OnOff(p.rx_markers), OnOff(p.large_fpdus), p.ird, p.ord, max_ulpdu, RtrLabel(p));
}

void PublishCause(stats::QpSlot* slot, stats::CauseRecord stats::QpDescription::*which,
                  const rdmap::TerminateCause& cause) {
  stats::UpdateDescription(slot, [&](stats::QpDescription& d) {
    stats::RecordCause(&(d.*which), cause.layer, cause.etype, cause.ecode);
  });
}

void PublishBound(stats::QpSlot* slot, int fd, const StreamParams& p, std::size_t max_ulpdu) {
  if (slot == nullptr) return;
  const transport::Endpoints ends = transport::QueryEndpoints(fd);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  stats::UpdateDescription(slot, [&](stats::QpDescription& d) {
    d = stats::QpDescription{};  // a new stream (a QP is bound again after RESET)
    d.bound = 1;
    d.mpa_dialect = p.mpa_dialect;
    d.mpa_revision = p.mpa_revision;
    d.crc = p.crc_enabled ? 1 : 0;
    d.tx_markers = p.tx_markers ? 1 : 0;
    d.rx_markers = p.rx_markers ? 1 : 0;
    d.large_fpdus = p.large_fpdus ? 1 : 0;
    d.rtr_role = static_cast<std::uint8_t>(p.rtr_role);
    d.ird = p.ird;
    d.ord = p.ord;
    d.max_ulpdu = static_cast<std::uint32_t>(max_ulpdu);
    d.local = ends.local;
    d.peer = ends.peer;
    d.bound_unix_ms = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
  });
}

void LogCause(std::uint32_t qp_num, const char* what, const rdmap::TerminateCause& cause) {
  if (!log::Enabled(log::Level::kInfo)) return;
  SIWX_QP_LOG(kInfo, qp_num, "%s: %s", what, rdmap::DescribeTerminateCause(cause).c_str());
}

WcOpcode WcOpcodeOf(SendOpcode opcode) {
  switch (opcode) {
    case SendOpcode::kSend:
    case SendOpcode::kSendWithInvalidate:
    case SendOpcode::kSendWithSolicitedEvent:
    case SendOpcode::kSendWithSeAndInvalidate:
      return WcOpcode::kSend;
    case SendOpcode::kRdmaWrite:
      return WcOpcode::kRdmaWrite;
    case SendOpcode::kRdmaRead:
      return WcOpcode::kRdmaRead;
    case SendOpcode::kLocalInvalidate:
      return WcOpcode::kLocalInv;
  }
  return WcOpcode::kSend;
}

}  // namespace

AsyncEventType EventForCause(const rdmap::TerminateCause& cause) {
  using rdmap::TerminateLayer;
  if (cause.layer == static_cast<std::uint8_t>(TerminateLayer::kRdmap)) {
    if (cause.etype == static_cast<std::uint8_t>(rdmap::RdmapErrorType::kRemoteProtection)) {
      return AsyncEventType::kQpAccessError;
    }
    if (cause.etype == static_cast<std::uint8_t>(rdmap::RdmapErrorType::kRemoteOperation)) {
      return AsyncEventType::kQpRequestError;
    }
  } else if (cause.layer == static_cast<std::uint8_t>(TerminateLayer::kDdp)) {
    if (cause.etype == static_cast<std::uint8_t>(rdmap::DdpErrorType::kTaggedBuffer)) {
      return AsyncEventType::kQpAccessError;
    }
    if (cause.etype == static_cast<std::uint8_t>(rdmap::DdpErrorType::kUntaggedBuffer)) {
      return AsyncEventType::kQpRequestError;
    }
  }
  return AsyncEventType::kQpFatal;
}

WcStatus StatusForPeerCause(const rdmap::TerminateCause& cause) {
  using rdmap::TerminateLayer;
  if (cause.layer == static_cast<std::uint8_t>(TerminateLayer::kRdmap)) {
    if (cause.etype == static_cast<std::uint8_t>(rdmap::RdmapErrorType::kRemoteProtection)) {
      return WcStatus::kRemAccessErr;
    }
    return WcStatus::kRemOpErr;
  }
  if (cause.layer == static_cast<std::uint8_t>(TerminateLayer::kDdp)) {
    if (cause.etype == static_cast<std::uint8_t>(rdmap::DdpErrorType::kTaggedBuffer)) {
      return WcStatus::kRemAccessErr;
    }
    if (cause.etype == static_cast<std::uint8_t>(rdmap::DdpErrorType::kUntaggedBuffer)) {
      // No buffer: the responder lacked a resource; everything else on an
      // untagged queue (MSN, MO, QN, length, version) is an invalid request.
      return cause.ecode == static_cast<std::uint8_t>(rdmap::DdpUntaggedErrorCode::kNoBuffer)
                 ? WcStatus::kRemOpErr
                 : WcStatus::kRemInvReqErr;
    }
  }
  return WcStatus::kRemOpErr;
}

Qp::Qp(Engine* engine, std::uint32_t qp_num, const QpConfig& config,
       std::unique_ptr<ReceiveQueue> own_rq)
    : engine_(engine),
      qp_num_(qp_num),
      config_(config),
      own_rq_(std::move(own_rq)),
      rq_(own_rq_ ? own_rq_.get() : config.srq),
      tx_(*this),
      rx_(*this) {
  sq_.slots = RecordSlots<SqEntry>(config_.sq_caps.max_wr,
                                   std::size_t{config_.sq_caps.max_sge} * sizeof(Sge));
  if (stats_slot_ != nullptr) state_.SetMirror(&stats_slot_->state);
}

Qp::~Qp() { stats::StatsFile::ReleaseForProcess(stats_slot_); }

// ---- The sides' view of the QP (qp_sides.h) ----

// Calls of QpForTx come from the transmit-gate holder; cheap to check.
#define SIWX_ASSERT_TX_GATE_HELD() assert(tx_gate_.load(std::memory_order_relaxed) != 0)

MemoryTable& Qp::memory() { return engine_->memory(); }

bool Qp::RtrReceived() const { return rtr_received_.load(std::memory_order_acquire); }

void Qp::MarkRtrReceived() {
  rtr_received_.store(true, std::memory_order_release);
  KickTx();
}

void Qp::EndStream(bool abort) { RequestFinalize(abort ? kFinalizeAbort : kFinalizeNone); }

std::optional<ReceiveWorkRequest> Qp::TakeReceive() { return rq_->Take(); }

void Qp::CompleteReceive(const WorkCompletion& wc, bool solicited) {
  PushRecvCompletion(wc, solicited);
}

std::optional<OrqEntry> Qp::OldestRead() {
  std::lock_guard lock(queue_mutex_);
  if (!orq_ || orq_->empty()) return std::nullopt;
  return *orq_->Front();
}

void Qp::CompleteOldestRead(const OrqEntry& read) {
  {
    std::lock_guard lock(queue_mutex_);
    if (orq_ && !orq_->empty()) orq_->Pop();
    if (!read.rtr) {
      SqEntry& entry = sq_.At(read.seq);
      if (!entry.done) {
        entry.done = true;
        entry.status = WcStatus::kSuccess;
      }
    }
  }
  if (!read.rtr) RetireSq();
  KickTx();  // an ORD slot or a fence may have opened
}

std::uint32_t Qp::ReadRequestsOutstanding() {
  std::lock_guard lock(queue_mutex_);
  return irq_outstanding_;
}

void Qp::QueueReadRequest(const IrqEntry& request) {
  std::uint32_t outstanding;
  {
    std::lock_guard lock(queue_mutex_);
    irq_->Push(request);
    outstanding = ++irq_outstanding_;
  }
  // Queued on the progress thread: nobody else answers this QP's Reads, so
  // it may spin for the next one (responder_spin.h).
  engine_->NoteReadRequestQueued(*this, request.size, outstanding);
}

std::optional<std::uint64_t> Qp::FindReadByMsn(std::uint32_t msn) {
  std::lock_guard lock(queue_mutex_);
  std::optional<std::uint64_t> found;
  if (!orq_) return found;
  for (std::uint32_t i = 0; i < orq_->size(); ++i) {
    const OrqEntry& e = orq_->At(i);
    if (e.msn == msn && !e.rtr) found = e.seq;
  }
  return found;
}

std::optional<std::uint64_t> Qp::FindUnfinishedSendByMsn(std::uint32_t msn) {
  std::lock_guard lock(queue_mutex_);
  std::optional<std::uint64_t> found;
  for (std::uint64_t seq = sq_.head; seq != sq_.tail; ++seq) {
    const SqEntry& e = sq_.At(seq);
    if (!e.done && e.wr.IsSend() && e.msn == msn) found = seq;
  }
  return found;
}

std::optional<std::uint64_t> Qp::FindUnfinishedWriteByStag(std::uint32_t stag) {
  std::lock_guard lock(queue_mutex_);
  for (std::uint64_t seq = sq_.head; seq != sq_.tail; ++seq) {
    const SqEntry& e = sq_.At(seq);
    if (!e.done && e.wr.opcode == SendOpcode::kRdmaWrite && e.wr.rkey == stag) return seq;
  }
  return std::nullopt;
}

void Qp::OnPeerClosedInOrder() {
  peer_closed_gracefully_.store(true);
  Transition(QpEvent::kPeerClosing);
}

transport::TcpStream* Qp::stream() {
  SIWX_ASSERT_TX_GATE_HELD();
  return stream_.get();
}

std::optional<TxMail> Qp::TakeMail() {
  SIWX_ASSERT_TX_GATE_HELD();
  if (!tx_mail_.load(std::memory_order_acquire)) return std::nullopt;
  TxMail mail;
  std::lock_guard lock(queue_mutex_);
  mail.terminate = std::move(tx_terminate_);
  tx_terminate_.reset();
  mail.close = tx_close_;
  tx_close_ = TxClose::kNone;
  tx_mail_.store(false, std::memory_order_relaxed);
  return mail;
}

std::uint64_t Qp::SqHead() {
  std::lock_guard lock(queue_mutex_);
  return sq_.head;
}

SqPeek Qp::PeekSq(std::uint64_t seq) {
  SIWX_ASSERT_TX_GATE_HELD();
  SqPeek peek;
  std::lock_guard lock(queue_mutex_);
  if (seq == sq_.tail || sq_.At(seq).flush_only) return peek;
  peek.wr = &sq_.At(seq).wr;
  peek.reads_outstanding = orq_ ? orq_->size() : 0;
  return peek;
}

void Qp::SetSqMsn(std::uint64_t seq, std::uint32_t msn) {
  std::lock_guard lock(queue_mutex_);
  sq_.At(seq).msn = msn;
}

void Qp::MarkSqDone(std::uint64_t seq) {
  std::lock_guard lock(queue_mutex_);
  SqEntry& entry = sq_.At(seq);
  if (!entry.done) {
    entry.done = true;
    entry.status = WcStatus::kSuccess;
  }
}

void Qp::PushOrq(const OrqEntry& read) {
  SIWX_ASSERT_TX_GATE_HELD();
  std::lock_guard lock(queue_mutex_);
  orq_->Push(read);
  if (!read.rtr) sq_.At(read.seq).msn = read.msn;
}

std::optional<IrqEntry> Qp::TakeReadRequest() {
  std::lock_guard lock(queue_mutex_);
  if (!irq_ || irq_->empty()) return std::nullopt;
  const IrqEntry request = *irq_->Front();
  irq_->Pop();
  return request;
}

void Qp::ResponsesSent(std::uint32_t count) {
  std::lock_guard lock(queue_mutex_);
  irq_outstanding_ -= std::min(irq_outstanding_, count);
}

void Qp::BeginSendAccounting() {
  SIWX_ASSERT_TX_GATE_HELD();
  send_accounting_.store(true, std::memory_order_seq_cst);
}

void Qp::EndSendAccounting() { send_accounting_.store(false, std::memory_order_release); }

#undef SIWX_ASSERT_TX_GATE_HELD

// ---- Transmit gate ----

void Qp::KickTx() {
  if (tx_gate_.fetch_add(1, std::memory_order_acq_rel) != 0) return;  // the owner pumps again
  RunTx(1);
}

void Qp::KickTxFromApplication() {
  // The progress thread pumps this stream (EPOLLOUT, say): its pump may or
  // may not take what was posted, so the next poll (or the timer) kicks
  // again, and by then the gate is free, so the polling thread becomes the
  // sender again. Only for a QP alone on its send CQ: with many (-q 64) the
  // progress thread's turns are shared with the polls (HelpTransmit), and
  // posts left to EPOLLOUT (below); in 12 alternated rounds of -q 64 this
  // rule cost 6 % there (performance-notes 3.38). Not for an application
  // that armed a CQ either: it sleeps on its completion channel, not in a poll.
  if (tx_pumped_by_progress_.load(std::memory_order_relaxed) && config_.send_cq->single_driver() &&
      !SleepsOnACompletionChannel() && !engine_->OnProgressThread()) {
    tx_kicks_left_to_poll_.fetch_add(1, std::memory_order_relaxed);
    LeaveTxToNextPoll();
    return;
  }
  if (tx_gate_.fetch_add(1, std::memory_order_acq_rel) != 0) {
    tx_kicks_to_owner_.fetch_add(1, std::memory_order_relaxed);
    return;  // the owner pumps again
  }
  // The socket was found full and its write interest is armed, so EPOLLOUT
  // wakes the progress thread, which pumps what this post added, once the
  // socket drains: a sendmsg now would find it full again or take only a
  // part (with 64 QPs mostly their 64 KiB unsent share), and the posting
  // thread would be the sender of every stream (performance-notes 3.19,
  // 3.20: with this, -q 64 moved more at less CPU). The interest comes off
  // only in a gate holder's pump or in OnPollEvent followed by a kick,
  // which the release below sees. Only while other streams wait too: a stream that waits
  // alone (one QP) keeps transmitting from the application thread.
  if (tx_blocked_.load(std::memory_order_relaxed) && engine_->tx_blocked_streams() > 1 &&
      !engine_->OnProgressThread()) {
    tx_kicks_left_to_epollout_.fetch_add(1, std::memory_order_relaxed);
    const std::uint32_t left = tx_gate_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if (left == 0) return;
    RunTx(left);  // kicks that came meanwhile (an EPOLLOUT among them) pump
    return;
  }
  RunTx(1);
}

void Qp::RunTx(std::uint32_t seen) {
  const Qp* outer = tls_tx_owner;
  tls_tx_owner = this;
  const bool progress = engine_->OnProgressThread();
  if (progress) tx_pumped_by_progress_.store(true, std::memory_order_relaxed);
  bool more = false;
  for (;;) {
    tx_idle_at_tail_.store(kTxBusy, std::memory_order_relaxed);
    more = tx_.Pump();
    if (progress) {
      if (const auto* hook = progress_pump_hook_.load(std::memory_order_acquire)) (*hook)();
    }
    const std::uint32_t left = tx_gate_.fetch_sub(seen, std::memory_order_acq_rel) - seen;
    if (left == 0) break;
    seen = left;
  }
  if (progress) tx_pumped_by_progress_.store(false, std::memory_order_relaxed);
  tls_tx_owner = outer;
  // The budget ran out with work left: let the progress thread take the
  // next turn after it has served the other QPs.
  if (more && !destroyed_.load(std::memory_order_acquire)) {
    engine_->Submit({Engine::CommandKind::kKickTx, shared_from_this(), 0});
  }
}

void Qp::LockTxExclusive() {
  std::uint32_t expected = 0;
  while (!tx_gate_.compare_exchange_weak(expected, 1, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
    expected = 0;
    // An inline owner is in a bounded, non-blocking pump.
    std::this_thread::yield();
  }
}

void Qp::WaitForSendAccounting() const {
  while (send_accounting_.load(std::memory_order_acquire)) std::this_thread::yield();
}

void Qp::UnlockTxExclusive() {
  const std::uint32_t left = tx_gate_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if (left != 0) RunTx(left);  // kicks that arrived meanwhile
}

// ---- Posting ----

PostStatus Qp::PostSend(const SendWorkRequest& wr) {
  std::size_t posted = 0;
  return PostSend(std::span<const SendWorkRequest>(&wr, 1), &posted);
}

PostStatus Qp::PostSend(std::span<const SendWorkRequest> wrs, std::size_t* posted) {
  return PostSendList(wrs, posted, false);
}

PostStatus Qp::PostSendAll(std::span<const SendWorkRequest> wrs) {
  std::size_t posted = 0;
  return PostSendList(wrs, &posted, true);
}

PostStatus Qp::PostSendList(std::span<const SendWorkRequest> wrs, std::size_t* posted,
                            bool all_or_nothing) {
  std::size_t count = 0;
  PostStatus status = PostStatus::kOk;
  bool flushed = false;
  // StreamLeftToProgress: a sink is a QP that took in kSinkOctets between
  // two of its posts, or 2 x kSinkOctets since the post before its last
  // (perftest's ib_send_bw receiver posts a credit Write every 170
  // messages, two of them 2 messages apart once per 512: with the first
  // rule alone, every such pair made it read 4 MiB itself, spinning; a
  // ping-pong posts per message received).
  const std::uint64_t rx_now = counters_.rx_octets.load(std::memory_order_relaxed);
  const std::uint64_t last_post = sink_mark_.load(std::memory_order_relaxed);
  sink_.store(rx_now - last_post >= kSinkOctets ||
                  rx_now - sink_mark_before_.load(std::memory_order_relaxed) >= 2 * kSinkOctets,
              std::memory_order_relaxed);
  sink_mark_before_.store(last_post, std::memory_order_relaxed);
  sink_mark_.store(rx_now, std::memory_order_relaxed);
  // Nor is a QP quiet that posts: the quiet time starts again.
  quiet_mark_.store(~std::uint64_t{0}, std::memory_order_relaxed);
  bool alone = false;  // a ping-pong post (placement)
  bool coalesce = false;  // transmit later, with the posts that follow
  std::optional<std::chrono::steady_clock::time_point> held_deadline;
  std::uint64_t answer_fpdus = 0;  // counters_.rx_fpdus when it was posted
  if (destroyed_.load(std::memory_order_acquire)) {
    status = PostStatus::kInvalidState;
  } else {
    std::lock_guard lock(queue_mutex_);
    if (all_or_nothing) {
      // The same checks as the loop below, all made before anything is queued.
      for (const SendWorkRequest& wr : wrs) {
        status = ValidateSendWorkRequest(wr, config_.sq_caps);
        if (status != PostStatus::kOk) break;
      }
      if (status == PostStatus::kOk && !wrs.empty() &&
          SendPostDisposition(state_.state()) == PostDisposition::kReject) {
        status = PostStatus::kInvalidState;
      }
      if (status == PostStatus::kOk && sq_.slots.size() - sq_.size() < wrs.size()) {
        status = PostStatus::kQueueFull;
      }
      if (status != PostStatus::kOk) wrs = {};
    }
    for (const SendWorkRequest& wr : wrs) {
      status = ValidateSendWorkRequest(wr, config_.sq_caps);
      if (status != PostStatus::kOk) break;
      PostDisposition disposition = SendPostDisposition(state_.state());
      if (disposition == PostDisposition::kReject && state_.state() == QpState::kRtr &&
          queue_sends_before_stream_.load(std::memory_order_acquire)) {
        disposition = PostDisposition::kAccept;  // waits in the SQ for Bind
      }
      if (disposition == PostDisposition::kReject) {
        status = PostStatus::kInvalidState;
        break;
      }
      if (sq_.size() >= sq_.slots.size()) {
        status = PostStatus::kQueueFull;
        break;
      }
      SqEntry* const stored = StoreSendRecord(sq_.tail, wr);
      if (stored == nullptr) {
        status = PostStatus::kQueueFull;  // no memory for inline data: ENOMEM
        break;
      }
      SqEntry& entry = *stored;
      entry.signaled = config_.sq_sig_all || wr.signaled();
      entry.done = false;
      entry.status = WcStatus::kSuccess;
      entry.msn = 0;
      // Closing/Terminate/Error: the WR is never started. Once the QP is
      // finalized it completes at once (unless sends are held); before that,
      // finalization flushes it behind the earlier WRs, keeping completion
      // order.
      entry.flush_status = WcStatus::kWrFlushErr;
      entry.flush_only = disposition == PostDisposition::kFlush;
      if (entry.flush_only && sq_finalized_ && !sends_held_) {
        entry.done = true;
        entry.status = WcStatus::kWrFlushErr;
        flushed = true;
      }
      ++sq_.tail;
      ++count;
    }
    // A ping-pong: nothing else in the SQ, and something came in since the
    // last post (a sender streaming into an idle SQ hears nothing back).
    const std::uint64_t fpdus_in = counters_.rx_fpdus.load(std::memory_order_relaxed);
    const bool answer = fpdus_in != rx_fpdus_at_post_;
    alone = count > 0 && sq_.size() == count && answer;
    answer_fpdus = fpdus_in;
    if (count > 0) rx_fpdus_at_post_ = fpdus_in;
    // Something came in since the last post: maybe the post answers it (a
    // ping-pong whose earlier unsignaled WRs are still in the SQ), so it
    // transmits at once.
    if (count > 0) coalesce = CoalesceTx(wrs.first(count), answer);
    if (count > 0 && sends_held_) held_deadline = StartHeldSendClockLocked();
  }
  if (posted != nullptr) *posted = count;
  if (flushed) RetireSq();
  if (held_deadline) engine_->ScheduleTimer(shared_from_this(), *held_deadline);
  // A ping-pong whose answer the progress thread places (no read lease): it
  // keeps off this CPU; a stream: no need (placement.h).
  const bool leased = read_lease_until_.load(std::memory_order_relaxed) != 0;
  if (count > 0 && !leased) {
    if (alone) {
      engine_->NoteApplicationCpu();
    } else {
      engine_->ClearApplicationCpu();
    }
  }
  // The answer spin follows the last post only.
  if (count > 0 && !(alone && !leased && ArmAnswerSpin(answer_fpdus)) &&
      answer_armed_.load(std::memory_order_relaxed)) {
    answer_armed_.store(false, std::memory_order_relaxed);
  }
  if (coalesce) {
    coalesced_posts_.fetch_add(1, std::memory_order_relaxed);
    LeaveTxToNextPoll();
  } else if (count > 0) {
    KickTxFromApplication();
  }
  return status;
}

void Qp::LeaveTxToNextPoll() {
  tx_owed_.store(true, std::memory_order_release);
  config_.send_cq->NoteTxOwed();
  if (config_.recv_cq != config_.send_cq) config_.recv_cq->NoteTxOwed();
  // Nobody may poll again (an application that waits for something
  // else): the progress thread transmits it soon in any case.
  if (!tx_owed_timer_.exchange(true, std::memory_order_acq_rel)) {
    engine_->ScheduleTimer(shared_from_this(),
                           std::chrono::steady_clock::now() + kTxCoalesceDelay);
  }
}

bool Qp::CoalesceTx(std::span<const SendWorkRequest> posted, bool answer) {
  const std::size_t limit = engine_->tx_coalesce_octets();
  const std::uint64_t recv_polls =
      config_.recv_cq != config_.send_cq ? config_.recv_cq->polls() : 0;
  const std::uint64_t polls = config_.send_cq->polls() + recv_polls;
  const bool back_to_back = polls == polls_at_post_;
  polls_at_post_ = polls;
  std::uint64_t octets = 0;
  for (const SendWorkRequest& wr : posted) octets += wr.total_length();
  // An answer waits for nobody; the progress thread and callbacks on it
  // transmit at once (no later poll of theirs to count on), and so does an
  // application that armed a CQ before posting: it will sleep on the
  // completion channel, not poll (ibv_req_notify_cq, then posts, then
  // ibv_get_cq_event).
  if (limit == 0 || answer || !back_to_back || SleepsOnACompletionChannel() ||
      engine_->OnProgressThread() || coalesced_octets_ + octets >= limit) {
    coalesced_octets_ = 0;
    return false;
  }
  coalesced_octets_ += octets;
  return true;
}

void Qp::FlushOwedTx() {
  if (tx_owed_.exchange(false, std::memory_order_acq_rel)) KickTxFromApplication();
}

Qp::SqEntry* Qp::StoreSendRecord(std::uint64_t seq, const SendWorkRequest& wr) {
  // SqEntry::wr is its last member and SqEntry has no tail padding, so the
  // slot's payload (the SGEs) directly follows the record.
  static_assert(alignof(SqEntry) == alignof(SendRecord) &&
                sizeof(SendRecord) % alignof(SendRecord) == 0);
  const std::size_t index = seq % sq_.slots.size();
  std::uint8_t* inline_at = sq_.slots.payload(index);
  if (wr.is_inline() && wr.inline_length > sq_.slots.payload_capacity()) {
    const std::size_t per_slot = config_.sq_caps.max_inline_data;
    if (!sq_.inline_area) {
      sq_.inline_area.reset(new (std::nothrow) std::uint8_t[sq_.slots.size() * per_slot]);
      if (!sq_.inline_area) return nullptr;
    }
    inline_at = sq_.inline_area.get() + index * per_slot;
  }
  SqEntry& entry = sq_.slots[index];
  entry.wr.Assign(wr, inline_at);
  return &entry;
}

PostStatus Qp::PostRecv(const ReceiveWorkRequest& wr) {
  if (destroyed_.load(std::memory_order_acquire) || !own_rq_) return PostStatus::kInvalidState;
  const PostDisposition disposition = ReceivePostDisposition(state_.state());
  if (disposition == PostDisposition::kReject) return PostStatus::kInvalidState;
  const PostStatus status = own_rq_->Post(wr);
  if (status != PostStatus::kOk) return status;
  // In ERR the WR completes with WrFlushErr; receive completions are pushed
  // only by the holder of rx_mutex_, which keeps them in order, so the
  // flush is the progress thread's (FlushReceives takes it). Checked after
  // the post so a concurrent finalization cannot strand it.
  if (state_.state() == QpState::kError) {
    engine_->Submit({Engine::CommandKind::kFlushReceives, shared_from_this(), 0});
  }
  return PostStatus::kOk;
}

// ---- State ----

QpStatus Qp::Modify(QpState target, std::optional<QpState> expected_current) {
  if (destroyed_.load(std::memory_order_acquire)) return QpStatus::kIllegalTransition;
  const TransitionResult t = state_.Modify(target, expected_current);
  if (t.status != QpStatus::kOk) return t.status;
  if (t.to == QpState::kReset) {
    queue_sends_before_stream_.store(false);
    ib_teardown_.store(false);
  }
  if (t.from == QpState::kError && t.to == QpState::kError) {
    if (receives_held_.exchange(false)) {
      engine_->Submit({Engine::CommandKind::kFlushReceives, shared_from_this(), 0});
    }
    ReleaseHeldSends(std::nullopt);
  }
  TransitionEffects effects;
  effects.wait_for_finalize = true;
  ApplyTransition(t, effects);
  return QpStatus::kOk;
}

TransitionResult Qp::Transition(QpEvent event, const TransitionEffects& effects) {
  const TransitionResult t = state_.Handle(event);
  ApplyTransition(t, effects);
  return t;
}

void Qp::ApplyTransition(const TransitionResult& t, const TransitionEffects& effects) {
  const std::uint32_t actions =
      (t.status == QpStatus::kOk ? t.actions : kQpActionNone) | effects.always;
  if ((actions & kQpActionCloseLlp) != 0) {
    {
      std::lock_guard lock(queue_mutex_);
      if (effects.terminate) {
        tx_terminate_ = effects.terminate;
      } else {
        tx_close_ = effects.close;
      }
      tx_mail_.store(true, std::memory_order_release);
    }
    ArmTeardown();
    KickTx();
  }
  if ((actions & (kQpActionFlushQueues | kQpActionDiscardQueues)) != 0 && !effects.finalizing) {
    std::uint32_t flags = kFinalizeNone;
    if ((actions & kQpActionAbortLlp) != 0) flags |= kFinalizeAbort;
    if ((actions & kQpActionDiscardQueues) != 0) flags |= kFinalizeDiscard | kFinalizeAbort;
    Engine::Command command{Engine::CommandKind::kFinalize, shared_from_this(), flags};
    if (effects.wait_for_finalize && !InsideEngineTurn()) {
      engine_->SubmitAndWait(std::move(command));
    } else {
      engine_->Submit(std::move(command));
    }
  }
}

BindStatus Qp::Bind(std::unique_ptr<transport::TcpStream> stream, const StreamParams& params) {
  if (destroyed_.load(std::memory_order_acquire)) return BindStatus::kInvalidState;
  if (!stream || stream->fd() < 0) return BindStatus::kInvalidStream;
  if (params.ird > config_.max_ird || params.ord > config_.max_ord) {
    return BindStatus::kInvalidParams;
  }
  const std::size_t max_ulpdu = EffectiveMaxUlpdu(params, stream->EffectiveMss());
  if (max_ulpdu < kMinMaxUlpdu) return BindStatus::kInvalidParams;
  const QpState s = state_.state();
  if (s != QpState::kInit && s != QpState::kRtr) return BindStatus::kInvalidState;
  int bound_fd = -1;
  {
    std::lock_guard lock(queue_mutex_);
    if (bound_) return BindStatus::kInvalidState;
    bound_ = true;
    params_ = params;
    max_ulpdu_ = max_ulpdu;
    // One extra IRQ slot: the peer's RTR Read is served even with IRD 0.
    orq_ = std::make_unique<WorkRing<OrqEntry>>(std::max<std::uint32_t>(params.ord, 1));
    irq_ = std::make_unique<WorkRing<IrqEntry>>(params.ird + 1);
    irq_outstanding_ = 0;
    sq_finalized_ = false;
    sq_error_seen_ = false;
    sends_held_ = false;
    held_sends_deadline_ = 0;
    tx_terminate_.reset();
    tx_close_ = TxClose::kNone;
    tx_mail_.store(false, std::memory_order_relaxed);
    bound_fd = stream->fd();
    pending_stream_ = std::move(stream);
  }
  {
    std::lock_guard lock(info_mutex_);
    error_raised_ = false;
    terminate_sent_.reset();
    terminate_received_.reset();
    local_error_.reset();
  }
  rtr_received_.store(params.rtr_role != RtrRole::kAwait && !params.await_first_fpdu,
                      std::memory_order_release);
  peer_closed_gracefully_.store(false);
  receives_held_.store(false);
  teardown_deadline_.store(0, std::memory_order_release);
  LockTxExclusive();
  tx_.Start(params, max_ulpdu);
  UnlockTxExclusive();
  const TransitionResult t = Transition(QpEvent::kConnectionEstablished);
  if (t.status != QpStatus::kOk) {
    LockTxExclusive();
    tx_.Stop();
    UnlockTxExclusive();
    std::lock_guard lock(queue_mutex_);
    bound_ = false;
    pending_stream_.reset();
    return BindStatus::kInvalidState;
  }
  // The stream is not attached yet, so its descriptor is still open here.
  LogBound(qp_num_, bound_fd, params, max_ulpdu);
  PublishBound(stats_slot_, bound_fd, params, max_ulpdu);
  engine_->Submit({Engine::CommandKind::kAttach, shared_from_this(), 0});
  return BindStatus::kOk;
}

bool Qp::Disconnect() { return Modify(QpState::kClosing) == QpStatus::kOk; }

void Qp::Destroy() {
  if (destroyed_.exchange(true, std::memory_order_acq_rel)) return;
  Engine::Command command{Engine::CommandKind::kDetach, shared_from_this(), 0};
  if (InsideEngineTurn()) {
    engine_->Submit(std::move(command));
  } else {
    engine_->SubmitAndWait(std::move(command));
  }
}

QpAttributes Qp::Query() const {
  QpAttributes a;
  a.qp_num = qp_num_;
  a.state = state_.state();
  a.pd = config_.pd;
  a.sq_caps = config_.sq_caps;
  a.rq_caps = own_rq_ ? own_rq_->caps() : QueueCaps{};
  a.has_srq = config_.srq != nullptr;
  a.sq_sig_all = config_.sq_sig_all;
  {
    std::lock_guard lock(queue_mutex_);
    a.bound = bound_;
    a.params = params_;
    a.max_ulpdu = max_ulpdu_;
    a.sq_outstanding = static_cast<std::uint32_t>(sq_.size());
  }
  {
    std::lock_guard lock(info_mutex_);
    a.terminate_sent = terminate_sent_;
    a.terminate_received = terminate_received_;
    a.local_error = local_error_;
  }
  return a;
}

QpCounters Qp::Counters() const {
  QpCounters c;
  constexpr auto r = std::memory_order_relaxed;
  c.tx_fpdus = counters_.tx_fpdus.load(r);
  c.tx_octets = counters_.tx_octets.load(r);
  c.tx_syscalls = counters_.tx_syscalls.load(r);
  c.tx_would_block = counters_.tx_would_block.load(r);
  c.rx_fpdus = counters_.rx_fpdus.load(r);
  c.rx_octets = counters_.rx_octets.load(r);
  c.rx_syscalls = counters_.rx_syscalls.load(r);
  c.rx_staged_payload = counters_.rx_staged_payload.load(r);
  c.rx_direct_payload = counters_.rx_direct_payload.load(r);
  return c;
}

// ---- Completions ----

void Qp::RetireSq() {
  if (sq_cq_gate_.fetch_add(1, std::memory_order_acq_rel) != 0) return;  // the owner retires again
  std::uint32_t seen = 1;
  for (;;) {
    for (;;) {
      std::array<WorkCompletion, 32> batch;
      std::size_t n = 0;
      std::size_t popped = 0;
      {
        std::lock_guard lock(queue_mutex_);
        while (n < batch.size() && sq_.size() > 0 && sq_.At(sq_.head).done) {
          SqEntry& e = sq_.At(sq_.head);
          // After a WR completes in error, the ones behind it are flushed,
          // even those already executed and only held for ordering (verbs:
          // the QP is in error from that WR on).
          if (e.status != WcStatus::kSuccess) {
            sq_error_seen_ = true;
          } else if (sq_error_seen_) {
            e.status = WcStatus::kWrFlushErr;
          }
          if (e.signaled || e.status != WcStatus::kSuccess) {
            WorkCompletion& wc = batch[n++];
            wc = WorkCompletion{};
            wc.wr_id = e.wr.wr_id;
            wc.status = e.status;
            wc.opcode = WcOpcodeOf(e.wr.opcode);
            wc.qp_num = qp_num_;
            if (e.status == WcStatus::kSuccess && e.wr.opcode != SendOpcode::kLocalInvalidate) {
              wc.byte_len = static_cast<std::uint32_t>(e.wr.total_length());
            }
          }
          ++sq_.head;
          ++popped;
        }
      }
      // Pushed outside queue_mutex_ (callbacks may post), inside the gate
      // (so completions keep WR order).
      for (std::size_t i = 0; i < n; ++i) {
        CountCompletion(batch[i].status);
        config_.send_cq->Push(batch[i]);
      }
      if (popped == 0) break;
    }
    const std::uint32_t left = sq_cq_gate_.fetch_sub(seen, std::memory_order_acq_rel) - seen;
    if (left == 0) return;
    seen = left;
  }
}

void Qp::FlushSqLocked() {
  for (std::uint64_t seq = sq_.head; seq != sq_.tail; ++seq) {
    SqEntry& e = sq_.At(seq);
    if (!e.done) {
      e.done = true;
      e.status = e.flush_status;
    }
  }
}

std::optional<std::uint64_t> Qp::OldestUnfinishedLocked() {
  for (std::uint64_t seq = sq_.head; seq != sq_.tail; ++seq) {
    if (!sq_.At(seq).done) return seq;
  }
  return std::nullopt;
}

std::optional<std::chrono::steady_clock::time_point> Qp::StartHeldSendClockLocked() {
  const std::chrono::nanoseconds timeout(ib_retry_timeout_ns_.load(std::memory_order_relaxed));
  if (!sends_held_ || held_sends_deadline_ != 0 || timeout.count() == 0 ||
      !OldestUnfinishedLocked()) {
    return std::nullopt;
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  held_sends_deadline_ = deadline.time_since_epoch().count();
  return deadline;
}

void Qp::ReleaseHeldSends(std::optional<std::chrono::steady_clock::time_point> due) {
  std::optional<std::uint64_t> timed_out;  // wr_id
  {
    std::lock_guard lock(queue_mutex_);
    if (!sends_held_) return;
    if (due) {
      if (held_sends_deadline_ == 0 || due->time_since_epoch().count() < held_sends_deadline_) {
        return;
      }
      // As an InfiniBand sender whose retries ran out: the oldest WR fails,
      // the QP is in error from it on (RetireSq flushes the rest).
      if (const std::optional<std::uint64_t> seq = OldestUnfinishedLocked()) {
        SqEntry& e = sq_.At(*seq);
        e.done = true;
        e.status = WcStatus::kRetryExcErr;
        timed_out = e.wr.wr_id;
      }
    }
    sends_held_ = false;
    held_sends_deadline_ = 0;
    FlushSqLocked();
  }
  if (timed_out) {
    SIWX_QP_LOG(kInfo, qp_num_,
                "the peer closed its end and send WR %llu waited out the transport timeout "
                "(IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT): it completes with retry count exceeded",
                static_cast<unsigned long long>(*timed_out));
  }
  RetireSq();
}

void Qp::CountCompletion(WcStatus status) {
  if (status == WcStatus::kSuccess || stats_slot_ == nullptr) return;
  auto& counter = status == WcStatus::kWrFlushErr ? stats_slot_->completions_flushed
                                                  : stats_slot_->completion_errors;
  counter.fetch_add(1, std::memory_order_relaxed);
}

void Qp::PushRecvCompletion(const WorkCompletion& wc, bool solicited) {
  CountCompletion(wc.status);
  config_.recv_cq->Push(wc, solicited);
}

// ---- Errors ----

bool Qp::RaiseError(const ErrorReport& report) {
  {
    std::lock_guard lock(info_mutex_);
    if (error_raised_) return false;
    error_raised_ = true;
    if (report.terminate) {
      terminate_sent_ = report.terminate;
      LogCause(qp_num_, "Terminate sent to the peer", report.terminate->cause);
      PublishCause(stats_slot_, &stats::QpDescription::terminate_sent, report.terminate->cause);
    } else if (!report.peer_terminated) {
      local_error_ = report.cause;
      PublishCause(stats_slot_, &stats::QpDescription::local_error, report.cause);
      LogCause(qp_num_, report.abort ? "stream reset (RST) without a Terminate"
                                     : "stream failed without a Terminate",
               report.cause);
    }
    if (report.failed_seq) {
      std::lock_guard queue_lock(queue_mutex_);
      const std::uint64_t seq = *report.failed_seq;
      if (seq >= sq_.head && seq < sq_.tail && !sq_.At(seq).done) {
        if (report.failed_now) {
          sq_.At(seq).done = true;
          sq_.At(seq).status = report.failed_status;
        } else {
          sq_.At(seq).flush_status = report.failed_status;
        }
      }
    }
  }
  // The stream ends whatever state it is in (a racing Modify or close may
  // have moved it already): with our Terminate, after the peer's, or RST.
  TransitionEffects effects;
  if (report.terminate && !report.abort) {
    effects.terminate = report.terminate;
    effects.always = kQpActionCloseLlp;
    Transition(QpEvent::kTerminateSent, effects);
  } else if (report.peer_terminated && !report.abort) {
    effects.close = TxClose::kStop;
    effects.always = kQpActionCloseLlp;
    Transition(QpEvent::kTerminateReceived, effects);
  } else {
    effects.always = kQpActionFlushQueues | kQpActionAbortLlp;
    Transition(QpEvent::kLocalError, effects);
  }
  if (report.event) EmitEvent(*report.event);
  if (report.failed_seq) RetireSq();
  return true;
}

void Qp::RecordTerminateReceived(const rdmap::TerminateHeader& header) {
  std::lock_guard lock(info_mutex_);
  if (terminate_received_) return;
  terminate_received_ = header;
  LogCause(qp_num_, "Terminate received from the peer", header.cause);
  PublishCause(stats_slot_, &stats::QpDescription::terminate_received, header.cause);
}

void Qp::RequestFinalize(std::uint32_t flags) {
  engine_->Submit({Engine::CommandKind::kFinalize, shared_from_this(), flags});
}

void Qp::ArmTeardown() {
  const auto deadline = std::chrono::steady_clock::now() + engine_->teardown_timeout();
  std::chrono::steady_clock::rep unarmed = 0;
  if (!teardown_deadline_.compare_exchange_strong(unarmed, deadline.time_since_epoch().count(),
                                                  std::memory_order_acq_rel)) {
    return;  // armed already: the first start of the end counts
  }
  engine_->ScheduleTimer(shared_from_this(), deadline);
}

// ---- Progress thread ----

void Qp::Attach() {
  if (detached_ || attached_ || destroyed_.load(std::memory_order_acquire)) return;
  std::unique_ptr<transport::TcpStream> stream;
  StreamParams params;
  {
    std::lock_guard lock(queue_mutex_);
    stream = std::move(pending_stream_);
    params = params_;
  }
  if (!stream) return;
  int add_error;
  {
    std::lock_guard rx_lock(rx_mutex_);
    LockTxExclusive();
    stream_ = std::move(stream);
    {
      std::lock_guard lock(poll_mutex_);
      poll_fd_ = stream_->fd();
      want_write_ = false;
      SetTxBlocked(false);
      unsent_limit_.store(0, std::memory_order_relaxed);  // a new socket: the default
      read_closed_ = false;
      read_leased_ = false;
      add_error = engine_->poller().Add(poll_fd_, this, /*want_read=*/true, /*want_write=*/false);
      polled_ = add_error == 0;
      registered_ = polled_;
    }
    rx_.Start(params);
    attached_ = true;
    UnlockTxExclusive();
  }
  first_fpdu_deadline_.reset();
  if (params.first_fpdu_timeout.count() > 0 && !rtr_received_.load(std::memory_order_acquire)) {
    first_fpdu_deadline_ = std::chrono::steady_clock::now() + params.first_fpdu_timeout;
    engine_->ScheduleTimer(shared_from_this(), *first_fpdu_deadline_);
  }
  if (!driven_) {
    // Both CQs: the application thread that polls either one gives this
    // QP's receive (and transmit) side a turn (DriveFromPoll).
    config_.recv_cq->AddDriver(this);
    config_.send_cq->AddDriver(this);
    driven_ = true;
  }
  if (add_error != 0) {
    ErrorReport report;
    report.cause = rdmap::TerminateCause::MpaLocalCatastrophic();
    report.event = AsyncEventType::kQpFatal;
    report.abort = true;
    RaiseError(report);
    return;
  }
  KickTx();
}

void Qp::Finalize(std::uint32_t flags) {
  if (detached_) return;
  // Held throughout: no receive turn may complete anything between the
  // flush and finalized_ (and callbacks here run on the progress thread).
  std::lock_guard rx_lock(rx_mutex_);
  const bool abort = (flags & kFinalizeAbort) != 0;
  const bool discard = (flags & kFinalizeDiscard) != 0;
  if (finalized_ && !discard) {
    // A later abort of a stream that is only draining.
    if (abort && stream_) {
      LockTxExclusive();
      StopPolling();
      stream_->Abort();
      stream_.reset();
      UnlockTxExclusive();
    }
    return;
  }
  // UseIbTeardown: the peer ended the stream in order, as a peer that
  // destroys its QP does. Its end leaves our WRs outstanding (the
  // application may still be polling for the last message, and a flush in
  // the same poll would look like a failure).
  const bool peer_ended_in_order =
      ib_teardown_.load() && peer_closed_gracefully_.load() && !abort && !discard;
  std::optional<std::chrono::steady_clock::time_point> held_deadline;
  bool had_stream = false;
  LockTxExclusive();
  tx_.Stop();
  if (stream_) {
    had_stream = true;
    if (abort || discard || rx_.eof()) {
      StopPolling();
      if (abort || discard) stream_->Abort();
      stream_.reset();
    }
    // Otherwise the FIN is out and the receive side drains until the peer
    // closes (closing now with unread data would turn our FIN into a RST),
    // within the teardown bound.
  }
  UnlockTxExclusive();
  if (stream_) ArmTeardown();

  if (discard) {
    rx_.Stop();
  } else {
    rx_.AbandonMessage(WcStatus::kWrFlushErr);
    TransitionEffects effects;
    effects.finalizing = true;  // this is the flush
    Transition(QpEvent::kLlpClosed, effects);
  }
  {
    std::lock_guard lock(queue_mutex_);
    if (discard) {
      sq_.head = sq_.tail;
      sq_error_seen_ = false;
      bound_ = false;
      pending_stream_.reset();
      sq_finalized_ = false;
      sends_held_ = false;
      held_sends_deadline_ = 0;
    } else if (peer_ended_in_order) {
      // SetIbRetryTimeout: what a destroyed peer QP never acknowledges.
      sends_held_ = true;
      sq_finalized_ = true;
      held_deadline = StartHeldSendClockLocked();
    } else {
      FlushSqLocked();
      sq_finalized_ = true;
    }
    if (orq_) orq_->Clear();
    if (irq_) irq_->Clear();
    irq_outstanding_ = 0;
    tx_terminate_.reset();
    tx_close_ = TxClose::kNone;
    tx_mail_.store(false, std::memory_order_relaxed);
  }
  if (!discard) RetireSq();
  if (held_deadline) engine_->ScheduleTimer(shared_from_this(), *held_deadline);
  // The peer's orderly end also leaves the receives as they are.
  if (peer_ended_in_order) receives_held_.store(true);
  if (own_rq_ && !peer_ended_in_order) {
    std::vector<ReceiveWorkRequest> flushed = own_rq_->Flush();
    if (!discard) {
      for (const ReceiveWorkRequest& wr : flushed) {
        WorkCompletion wc;
        wc.wr_id = wr.wr_id;
        wc.status = WcStatus::kWrFlushErr;
        wc.opcode = WcOpcode::kRecv;
        wc.qp_num = qp_num_;
        PushRecvCompletion(wc, false);
      }
    }
  }
  if (discard) {
    std::lock_guard lock(info_mutex_);
    error_raised_ = false;
    attached_ = false;
    finalized_ = false;
    teardown_deadline_.store(0, std::memory_order_release);
  } else {
    finalized_ = true;
    if (config_.srq != nullptr && had_stream) EmitEvent(AsyncEventType::kQpLastWqeReached);
  }
  if (had_stream) EmitEvent(AsyncEventType::kStreamClosed);
}

void Qp::Detach() {
  if (detached_) return;
  {
    std::lock_guard rx_lock(rx_mutex_);
    LockTxExclusive();
    // A destroy ends the stream as Linux siw's does (it releases the
    // socket): what TCP holds still reaches the peer, then FIN. The last
    // message may still be in our send buffer when the application saw
    // its completion and destroyed the QP (perftest's rdma_cm exchange
    // ends so), and an RST would discard it. WRs not yet started are
    // dropped, but an FPDU partly on the wire is finished or, if the socket
    // has no room for its rest now, the stream is reset: a FIN must never
    // cut one. A stream that an error already ended without our FIN is
    // reset.
    const bool orderly = stream_ && (tx_.fin_sent() || !finalized_);
    const bool graceful = orderly && tx_.FinishStartedFpdu();
    tx_.Stop();
    if (stream_) {
      StopPolling();
      if (graceful) {
        CloseStreamInOrder();
      } else {
        stream_->Abort();
      }
      stream_.reset();
    }
    rx_.Stop();
    detached_ = true;
    UnlockTxExclusive();
  }
  if (driven_) {
    // Waits for a poll that is inside DriveFromPoll; after this no
    // application thread reaches the QP through its CQs.
    config_.recv_cq->RemoveDriver(this);
    config_.send_cq->RemoveDriver(this);
    driven_ = false;
  }
  std::lock_guard lock(queue_mutex_);
  pending_stream_.reset();
}

void Qp::CloseStreamInOrder() {
  // FIN after what TCP still holds (unless it is out already); the kernel
  // keeps sending after close. Unread input would turn the close into an
  // RST, so what the peer sent is read and dropped first, bounded so that
  // a peer that keeps sending cannot hold the destroy (it gets the RST).
  if (!tx_.fin_sent()) stream_->ShutdownWrite();
  std::array<std::uint8_t, 4096> sink;
  for (int i = 0; i < 256; ++i) {
    if (stream_->Read(sink).status != transport::IoStatus::kOk) break;
  }
}

void Qp::FlushReceives() {
  if (detached_ || !own_rq_ || state_.state() != QpState::kError) return;
  receives_held_.store(false);
  std::lock_guard rx_lock(rx_mutex_);
  for (const ReceiveWorkRequest& wr : own_rq_->Flush()) {
    WorkCompletion wc;
    wc.wr_id = wr.wr_id;
    wc.status = WcStatus::kWrFlushErr;
    wc.opcode = WcOpcode::kRecv;
    wc.qp_num = qp_num_;
    PushRecvCompletion(wc, false);
  }
}

void Qp::OnTimer(std::chrono::steady_clock::time_point now) {
  if (tx_owed_timer_.exchange(false, std::memory_order_acq_rel)) FlushOwedTx();
  if (detached_ || !attached_) return;
  bool lease_ended = false;
  bool lease_watched = false;
  std::optional<std::chrono::steady_clock::time_point> lease_next;
  {
    std::lock_guard lock(poll_mutex_);
    if (read_leased_ && now >= lease_check_at_) {
      read_lease_looks_.fetch_add(1, std::memory_order_relaxed);
      const std::chrono::steady_clock::time_point until(std::chrono::steady_clock::duration(
          read_lease_until_.load(std::memory_order_relaxed)));
      const ReadLeaseCheck check = CheckReadLease(now, until, lease_check_interval_);
      lease_ended = check.end;
      if (check.watch) {
        // Extended all along: from now on the polls that extend it keep
        // the engine's watch from waking this thread (read_lease.h).
        lease_check_at_ = kLeaseWatched;
        lease_watched = true;
      } else if (!check.end) {
        // A driving poll extended it: look again later, and less often the
        // longer it lasts.
        lease_check_at_ = check.next;
        lease_check_interval_ = check.interval;
        lease_next = check.next;
      }
    }
  }
  if (lease_ended) EndReadLease();
  if (lease_watched) engine_->WatchReadLease(shared_from_this());
  if (lease_next) engine_->ScheduleTimer(shared_from_this(), *lease_next);
  if (first_fpdu_deadline_ && now >= *first_fpdu_deadline_) {
    first_fpdu_deadline_.reset();
    if (!rtr_received_.load(std::memory_order_acquire)) {
      // RFC 5044 7.1.2 rules 4 and 10: no first FPDU (or RTR) in time. We
      // may send no FPDU before it, a Terminate included: reset the stream.
      SIWX_QP_LOG(kInfo, qp_num_, "no first FPDU or RTR from the peer in time (RFC 5044 7.1.2 "
                  "rule 10)");
      ErrorReport report;
      report.cause = rdmap::TerminateCause::MpaConnectionLost();
      report.event = AsyncEventType::kQpFatal;
      report.abort = true;
      RaiseError(report);
      return;
    }
  }
  ReleaseHeldSends(now);
  const std::chrono::steady_clock::rep deadline = teardown_deadline_.load(std::memory_order_acquire);
  if (deadline == 0 || now.time_since_epoch().count() < deadline) return;
  if (finalized_ && !stream_) return;  // gone in time
  if (!finalized_) {
    // The Terminate or FIN is still stuck behind data the peer does not
    // read (or does not acknowledge): the stream ends with an RST and the
    // QP reports a lost connection, unless an error says more already.
    std::lock_guard lock(info_mutex_);
    if (!error_raised_) {
      error_raised_ = true;
      local_error_ = rdmap::TerminateCause::MpaConnectionLost();
      PublishCause(stats_slot_, &stats::QpDescription::local_error, *local_error_);
    }
  }
  SIWX_QP_LOG(kInfo, qp_num_,
              "teardown bound of %lld ms passed with the stream still open: resetting it (RST)",
              static_cast<long long>(engine_->teardown_timeout().count()));
  // Not finalized: flush, Error, stream closed with RST. Finalized but the
  // peer never closed its side: only the RST.
  Finalize(kFinalizeAbort);
}

void Qp::OnPollEvent(bool readable, bool writable, bool hangup) {
  if (detached_ || !stream_) return;
  if (writable) TransmitWhenWritable();
  // Waits out a receive turn an application thread may be taking.
  std::lock_guard rx_lock(rx_mutex_);
  if ((readable || hangup) && stream_) rx_.OnReadable(*stream_);
  // A drained stream of a finalized QP is closed once the peer closed too.
  if (finalized_ && rx_.eof() && stream_) {
    LockTxExclusive();
    StopPolling();
    stream_.reset();
    UnlockTxExclusive();
  }
}

void Qp::TransmitWhenWritable() {
  if (tx_gate_.load(std::memory_order_acquire) != 0) {
    // Another thread owns the transmit side (an application transmitting
    // inline). Level-triggered EPOLLOUT would wake this thread again and
    // again until that thread fills the socket or empties its queue (up to
    // 90 000 wake-ups a second with 64 QPs, performance-notes 3.14, 3.19), so the
    // write interest comes off first; the kick below then makes the owner
    // pump once more, and that pump arms it again if it finds the socket
    // full (QpTx::Write). If the owner is gone by then, the kick pumps here.
    tx_wakes_owned_.fetch_add(1, std::memory_order_relaxed);
    SetWriteInterest(false);
  }
  KickTx();
}

bool Qp::HelpTransmit() { return engine_->HelpTransmit(); }

bool Qp::ReadInResponderSpin() {
  if (detached_ || !stream_) return false;
  {
    std::lock_guard lock(poll_mutex_);
    if (!polled_ || read_leased_ || read_closed_) return false;
  }
  std::unique_lock rx_lock(rx_mutex_, std::try_to_lock);
  if (!rx_lock.owns_lock() || !stream_) return false;
  const std::uint64_t reads_before = counters_.rx_syscalls.load(std::memory_order_relaxed);
  rx_.OnReadable(*stream_);
  return counters_.rx_syscalls.load(std::memory_order_relaxed) != reads_before;
}

void Qp::DriveFromPoll(const CompletionQueue& polled) {
  // The progress thread receives anyway; a nested call (callback) must not.
  if (destroyed_.load(std::memory_order_acquire) || tls_rx_driver != nullptr ||
      engine_->OnProgressThread() || !ProcessesInbound(state_.state())) {
    return;
  }
  // Receive work completes on `polled` only for an inbound Send (receive
  // CQ, a receive posted) or the last Read Response of one of our Reads
  // (send CQ); otherwise an empty poll costs no recvmsg. The transmit side
  // is not retried from here when the socket is full: a sendmsg that finds
  // no room on every empty poll cost ib_write_bw more than half its
  // bandwidth (docs/performance-notes.md 3.1).
  // Such a poll takes (or extends) the read lease; while it lasts, any
  // empty poll of either CQ reads, as the progress thread does not.
  const bool receives = &polled == config_.recv_cq && rq_->size() > 0;
  const bool reads = &polled == config_.send_cq && ReadsOutstanding();
  const auto lease_until = read_lease_until_.load(std::memory_order_relaxed);
  // Never leased (a sender polling its send CQ): no clock read either; it
  // was 5% of ib_write_bw -q 64's samples (docs/performance-notes.md 3.4).
  if (!receives && !reads && lease_until == 0) return;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < poll_idle_until_.load(std::memory_order_relaxed)) return;
  if (!receives && !reads && now >= lease_until) return;
  // A sink polled on its receive CQ, alone there, reads its own stream
  // (run to completion: one thread per message instead of the progress
  // thread reading and waking the poller; WaitForInput sleeps on the socket).
  const bool own_input = receives && polled.single_driver() && IsSink();
  if (polled.poll_wait().count() > 0 && !own_input && StreamLeftToProgress(now)) {
    // A stream that has been quiet for a while, or a sink, is left to the
    // progress thread (read interest back), so that the poll may sleep
    // instead of reading an empty socket over and over (PollMayWait): an
    // idle connection next to a busy one, such as perftest's key-exchange
    // QP, or the receiver of ib_send_bw.
    if (lease_until != 0) EndReadLease();
    return;
  }
  std::unique_lock rx_lock(rx_mutex_, std::try_to_lock);
  if (!rx_lock.owns_lock() || !attached_ || finalized_ || detached_ || !stream_) return;
  tls_rx_driver = this;
  const std::uint64_t reads_before = counters_.rx_syscalls.load(std::memory_order_relaxed);
  poll_receive_turns_.fetch_add(1, std::memory_order_relaxed);
  rx_.OnReadable(*stream_);
  if (counters_.rx_syscalls.load(std::memory_order_relaxed) == reads_before) {
    const auto idle = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        kEmptyPollBackoff);
    // From the end of the read: the recvmsg itself takes about a microsecond.
    const auto after = std::chrono::steady_clock::now().time_since_epoch().count();
    poll_idle_until_.store(after + idle.count(), std::memory_order_relaxed);
  } else {
    last_poll_input_.store(now, std::memory_order_relaxed);
  }
  tls_rx_driver = nullptr;
  if (receives || reads) {
    // The clock read before the turn serves: a lease is 1 ms, a turn microseconds.
    using Clock = std::chrono::steady_clock;
    ExtendReadLease(Clock::time_point(Clock::duration(now)));
    engine_->ClearApplicationCpu();
  }
}

bool Qp::StreamLeftToProgress(std::chrono::steady_clock::rep now) {
  // A sink: a bulk stream comes in and (almost) nothing goes out; the
  // progress thread reads it (one thread working, as with a TCP receiver
  // blocked in recv) and the poller sleeps until it pushes. A ping-pong of
  // messages below kSinkOctets posts more often and never gets here.
  if (IsSink()) return true;
  const std::uint64_t seen = counters_.rx_syscalls.load(std::memory_order_relaxed);
  if (seen != quiet_mark_.load(std::memory_order_relaxed)) {
    quiet_mark_.store(seen, std::memory_order_relaxed);
    quiet_since_.store(now, std::memory_order_relaxed);
    return false;
  }
  const auto quiet = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      kQuietBeforePollWait);
  return now - quiet_since_.load(std::memory_order_relaxed) >= quiet.count();
}

bool Qp::PollMayWait(const CompletionQueue& polled) {
  if (destroyed_.load(std::memory_order_acquire) || engine_->OnProgressThread() ||
      state_.state() != QpState::kRts) {
    return false;
  }
  // Either CQ counts, not only the polled one: the thread may poll the
  // other next, and what could complete there must not wait for this one.
  // Transmit side: a full socket is the progress thread's (EPOLLOUT); a
  // socket with room leaves nothing to complete only with no Read Response
  // owed (irq_outstanding_) and an SQ that is empty or holds only what
  // waits for input: the pump stopped idle since the last post (a Read is
  // an SQ entry until its response is placed; an ORD slot, a fence).
  const bool tx_blocked = tx_blocked_.load(std::memory_order_relaxed);
  bool reads = false;
  {
    std::lock_guard lock(queue_mutex_);
    reads = orq_ && !orq_->empty();
    if (!tx_blocked && (irq_outstanding_ != 0 || (sq_.size() != 0 && !TxIdleLocked()))) {
      return false;
    }
  }
  // Receive side: nothing to complete (no receive posted, no Read), or a
  // stream left to the progress thread (quiet, or a sink: see
  // StreamLeftToProgress), which reads it (read interest back) and pushes
  // what completes.
  const auto lease_until = read_lease_until_.load(std::memory_order_relaxed);
  if (lease_until == 0 && !reads && rq_->size() == 0) return true;
  // A sink that reads its own stream (DriveFromPoll) keeps its lease: the
  // wait is on its socket (WaitForInput), which only a single driver gets.
  if (ReadsOwnInput(polled)) return true;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (!StreamLeftToProgress(now)) return false;
  if (lease_until != 0) EndReadLease();
  return true;
}

bool Qp::ReadsOwnInput(const CompletionQueue& polled) {
  if (!polled.single_driver() || read_lease_until_.load(std::memory_order_relaxed) == 0) {
    return false;
  }
  // Send completions that EPOLLOUT will push come from the progress thread:
  // the CQ's own wait, which that push ends.
  if (&polled == config_.recv_cq && rq_->size() != 0 && IsSink()) {
    return !FullSocketHoldsOwnWrs();
  }
  if (&polled != config_.send_cq) return false;
  {
    std::lock_guard lock(queue_mutex_);
    if (!orq_ || orq_->size() < kBulkReads || irq_outstanding_ != 0 || !TxIdleLocked()) {
      return false;
    }
  }
  // The clock last: a Read ping-pong's empty polls (one Read outstanding)
  // read none here.
  using Clock = std::chrono::steady_clock;
  const auto gap = std::chrono::duration_cast<Clock::duration>(kInputGapBeforeWait).count();
  return Clock::now().time_since_epoch().count() -
             last_poll_input_.load(std::memory_order_relaxed) >=
         gap;
}

bool Qp::TxIdleLocked() const {
  return !tx_blocked_.load(std::memory_order_relaxed) &&
         tx_idle_at_tail_.load(std::memory_order_relaxed) == sq_.tail;
}

void Qp::NoteTxIdle() {
  std::lock_guard lock(queue_mutex_);
  tx_idle_at_tail_.store(sq_.tail, std::memory_order_relaxed);
}

bool Qp::WaitForInput(const CompletionQueue& polled, std::chrono::nanoseconds max) {
  if (destroyed_.load(std::memory_order_acquire) || engine_->OnProgressThread() ||
      !ReadsOwnInput(polled)) {
    return false;
  }
  // The lease outlasts the sleep, so the progress thread does not take the
  // stream back meanwhile (its timer would turn read interest on).
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  ExtendReadLease(now);
  const auto sleep = std::min<std::chrono::nanoseconds>(max, kReadLease / 2);
  int fd = -1;
  {
    std::lock_guard lock(poll_mutex_);
    if (!polled_ || !read_leased_ || read_closed_) return false;
    fd = poll_fd_;
  }
  // The socket may close meanwhile (teardown on another thread): then the
  // sleep runs out, at most `sleep`, and the next poll sees the state.
  transport::WaitReadableFor(fd, sleep);
  poll_idle_until_.store(0, std::memory_order_relaxed);
  return true;
}

bool Qp::ArmAnswerSpin(std::uint64_t fpdus_in) {
  const auto max = engine_->answer_spin();
  if (max <= std::chrono::nanoseconds::zero() || engine_->OnProgressThread() ||
      SleepsOnACompletionChannel()) {
    return false;  // off, or an application that sleeps on a completion channel
  }
  using Clock = std::chrono::steady_clock;
  const Clock::rep now = Clock::now().time_since_epoch().count();
  const Clock::rep previous = last_pingpong_post_.exchange(now, std::memory_order_relaxed);
  const auto cadence = std::chrono::duration_cast<Clock::duration>(2 * max).count();
  // The first ping-pong post of the QP gets the full budget too.
  if (previous == 0 || now - previous <= cadence) {
    answer_budget_ns_.store(max.count(), std::memory_order_relaxed);
  }
  if (answer_budget_ns_.load(std::memory_order_relaxed) <= 0) return false;
  answer_mark_.store(fpdus_in, std::memory_order_relaxed);
  answer_armed_.store(true, std::memory_order_release);
  config_.send_cq->NoteAnswerAwaited();
  return true;
}

void Qp::AwaitAnswer(const CompletionQueue& polled) {
  // A load first: the other drivers of a CQ whose poll lets them wait
  // write nothing shared.
  if (&polled != config_.send_cq || !answer_armed_.load(std::memory_order_relaxed) ||
      !answer_armed_.exchange(false, std::memory_order_acq_rel)) {
    return;
  }
  if (destroyed_.load(std::memory_order_acquire) || tls_rx_driver != nullptr ||
      engine_->OnProgressThread() || !ProcessesInbound(state_.state())) {
    return;
  }
  const std::uint64_t mark = answer_mark_.load(std::memory_order_relaxed);
  if (counters_.rx_fpdus.load(std::memory_order_relaxed) != mark) return;  // already in
  const std::int64_t budget = answer_budget_ns_.load(std::memory_order_relaxed);
  if (budget <= 0) return;
  // Read interest off for the spin (as a read lease, but without its timer:
  // the spin ends here, whatever happens).
  bool took_interest = false;
  {
    std::lock_guard lock(poll_mutex_);
    if (!polled_ || read_closed_) return;
    took_interest = TakeReadInterestLocked();
    if (!took_interest && !read_leased_) return;  // interest could not be taken off
  }
  answer_spins_.fetch_add(1, std::memory_order_relaxed);
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + std::chrono::nanoseconds(budget);
  bool caught = false;
  while (!caught) {
    {
      std::unique_lock rx_lock(rx_mutex_, std::try_to_lock);
      if (rx_lock.owns_lock()) {
        if (!attached_ || finalized_ || detached_ || !stream_) break;
        tls_rx_driver = this;
        rx_.OnReadable(*stream_);
        tls_rx_driver = nullptr;
      }
    }
    caught = counters_.rx_fpdus.load(std::memory_order_relaxed) != mark;
    if (!caught && Clock::now() >= until) break;
  }
  if (caught) {
    answers_caught_.fetch_add(1, std::memory_order_relaxed);
  } else {
    answer_budget_ns_.store(budget / 2, std::memory_order_relaxed);
  }
  if (took_interest) {
    bool lost = false;
    std::optional<Clock::time_point> lease_check;
    {
      std::lock_guard lock(poll_mutex_);
      if (!read_leased_) return;  // ended meanwhile (an armed CQ, the stream)
      const Clock::rep lease_until = read_lease_until_.load(std::memory_order_relaxed);
      if (lease_until != 0) {
        // A driving poll extended the lease during the spin, finding
        // interest already off: from now on it is that lease, with the
        // progress thread's look at its end (ExtendReadLease).
        lease_check_at_ = Clock::time_point(Clock::duration(lease_until));
        lease_check_interval_ = kReadLease;
        lease_check = lease_check_at_;
      } else {
        lost = ReturnReadInterestLocked();
      }
    }
    if (lease_check) engine_->ScheduleTimer(shared_from_this(), *lease_check);
    if (lost) ReadInterestLost();
  }
}

bool Qp::PollPushDue() {
  return FullSocketHoldsOwnWrs() || IsSink();
}

bool Qp::FullSocketHoldsOwnWrs() {
  // A full socket brings a push only for WRs of ours: Read Responses owed
  // to the peer complete nothing here (a passive ib_read_bw slept 1 ms).
  if (!tx_blocked_.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(queue_mutex_);
  return sq_.size() != 0;
}

bool Qp::IsSink() const {
  return sink_.load(std::memory_order_relaxed) ||
         counters_.rx_octets.load(std::memory_order_relaxed) -
                 sink_mark_.load(std::memory_order_relaxed) >=
             kSinkOctets;
}

void Qp::OnCqArmed(const CompletionQueue& /*cq*/) {
  // The application is about to sleep: nothing it posted may wait.
  FlushOwedTx();
  if (read_lease_until_.load(std::memory_order_relaxed) != 0) EndReadLease();
}

void Qp::ExtendReadLease(std::chrono::steady_clock::time_point now) {
  const auto until = now + kReadLease;
  read_lease_until_.store(until.time_since_epoch().count(), std::memory_order_relaxed);
  engine_->PushLeaseWatch(now);
  {
    std::lock_guard lock(poll_mutex_);
    if (!TakeReadInterestLocked()) return;  // held already, or stays as it was
    read_leases_taken_.fetch_add(1, std::memory_order_relaxed);
    lease_check_at_ = until;
    lease_check_interval_ = kReadLease;
  }
  engine_->ScheduleTimer(shared_from_this(), until);
}

void Qp::EndReadLease() {
  read_lease_until_.store(0, std::memory_order_relaxed);
  bool lost;
  {
    std::lock_guard lock(poll_mutex_);
    if (!read_leased_) return;
    lost = ReturnReadInterestLocked();
  }
  if (lost) ReadInterestLost();
}

bool Qp::read_lease_watched() const {
  std::lock_guard lock(poll_mutex_);
  return read_leased_ && lease_check_at_ == kLeaseWatched;
}

bool Qp::LookAtWatchedLease(std::chrono::steady_clock::time_point now) {
  {
    std::lock_guard lock(poll_mutex_);
    if (!read_leased_) return false;
    // A lease taken again since it was handed over is the timers' until
    // its looks reach the bound.
    if (lease_check_at_ != kLeaseWatched) return false;
    read_lease_looks_.fetch_add(1, std::memory_order_relaxed);
    const std::chrono::steady_clock::time_point until(std::chrono::steady_clock::duration(
        read_lease_until_.load(std::memory_order_relaxed)));
    if (now < until) return true;
  }
  EndReadLease();
  return false;
}

bool Qp::TakeReadInterestLocked() {
  if (read_leased_ || !polled_ || read_closed_) return false;
  if (ApplyPollInterest(false, want_write_) != 0) return false;
  read_leased_ = true;
  return true;
}

bool Qp::ReturnReadInterestLocked() {
  const bool lost = polled_ && !read_closed_ && ApplyPollInterest(true, want_write_) != 0;
  read_leased_ = false;
  return lost;
}

void Qp::ReadInterestLost() {
  // Without read interest nothing would read for an application that
  // stops polling: the stream is lost.
  ErrorReport report;
  report.cause = rdmap::TerminateCause::MpaLocalCatastrophic();
  report.event = AsyncEventType::kQpFatal;
  report.abort = true;
  RaiseError(report);
}

bool Qp::ReadsOutstanding() const {
  std::lock_guard lock(queue_mutex_);
  return orq_ && !orq_->empty();
}

// Read interest that a read lease or an answer spin takes off leaves the fd
// in the poller with the rest of its mask, an empty one included (epoll_ctl
// MOD): a DEL and an ADD free and allocate an epoll item, the frees go
// through RCU, and its kernel threads then preempted the spinning
// applications of a ping-pong (docs/performance-notes.md 3.27). An fd whose
// read side is closed leaves the poller unless it waits to write: a socket
// closed in both directions reports EPOLLHUP even with an empty mask, which
// would wake the progress thread in a loop until the QP is destroyed.
int Qp::ApplyPollInterest(bool read, bool write) {
  const bool stays = read || write || !read_closed_;
  if (registered_) {
    if (stays) return engine_->poller().Modify(poll_fd_, this, read, write);
    registered_ = false;
    return engine_->poller().Remove(poll_fd_);
  }
  if (!stays) return 0;
  const int rc = engine_->poller().Add(poll_fd_, this, read, write);
  registered_ = rc == 0;
  return rc;
}

bool Qp::SetWriteInterest(bool want) {
  {
    std::lock_guard lock(poll_mutex_);
    if (!polled_) return false;
    if (want_write_ != want) {
      if (ApplyPollInterest(!read_closed_ && !read_leased_, want) != 0) return false;
      want_write_ = want;
      SetTxBlocked(want);
    }
  }
  // The socket is full: its share of the unsent octets of every stream
  // that waits now (performance-notes 3.14). The transmit side is ours
  // (the gate), so stream_ stays.
  if (want && stream_) {
    const std::size_t limit = UnsentLimitFor(engine_->tx_blocked_streams());
    if (limit != unsent_limit_.load(std::memory_order_relaxed) &&
        stream_->SetUnsentLimit(limit) == 0) {
      unsent_limit_.store(limit, std::memory_order_relaxed);
    }
  }
  return true;
}

void Qp::SetTxBlocked(bool blocked) {
  if (tx_blocked_.exchange(blocked, std::memory_order_relaxed) == blocked) return;
  if (blocked) {
    engine_->tx_blocked_streams_.fetch_add(1, std::memory_order_relaxed);
  } else {
    engine_->tx_blocked_streams_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void Qp::StopReading() {
  std::lock_guard lock(poll_mutex_);
  if (!polled_ || read_closed_) return;
  read_closed_ = true;  // first: it decides whether the fd stays in the poller
  ApplyPollInterest(false, want_write_);
}

void Qp::StopPolling() {
  std::lock_guard lock(poll_mutex_);
  if (!polled_) return;
  if (registered_) engine_->poller().Remove(poll_fd_);
  registered_ = false;
  polled_ = false;
  want_write_ = false;
  SetTxBlocked(false);
  read_leased_ = false;
}

void Qp::EmitEvent(AsyncEventType type) { engine_->Emit(AsyncEvent{type, qp_num_}); }

}  // namespace siwx::engine
