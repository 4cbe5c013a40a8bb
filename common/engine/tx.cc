// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/tx.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <utility>

#include "common/engine/engine.h"
#include "common/engine/qp.h"
#include "common/engine/rx.h"

namespace siwx::engine {
namespace {

// Wire octets one turn may write before yielding to other QPs (the progress
// thread) or handing the rest to the progress thread (an inline poster).
constexpr std::size_t kPumpBudget = std::size_t{8} << 20;
// FPDUs framed ahead: about this many octets, within [kMinSlots, kMaxSlots].
constexpr std::size_t kBatchOctets = std::size_t{2} << 20;
constexpr std::size_t kMinSlots = 16;
constexpr std::size_t kMaxSlots = 64;
// Slots an idle QP keeps (a ping-pong needs one), and idle slots the process
// keeps for any QP. A streaming QP goes idle after every batch, so the pool
// holds two full rings (kMaxSlots each, about 365 KiB): with room for 16 per
// thread, ib_send_bw between two namespaces fell from 1.07-1.14x to
// 0.77-0.81x iperf3, freeing and allocating most of its slots for every
// 64 KiB message.
constexpr std::size_t kKeptSlots = 1;
constexpr std::size_t kPooledSlots = 2 * kMaxSlots;
// Read Response copies (CRC on) a QP frames ahead of sendmsg: a batch of
// them is copied, then read by sendmsg, so it should fit in one core's L2
// (2 MiB here) next to the source and the kernel's socket buffers. A whole
// batch (kBatchOctets) made both the copy and sendmsg's read of it miss L2
// (performance-notes 3.17); 256 KiB pieces cost about as much in extra
// sendmsg calls (loopback delivery) as they saved (3.22).
constexpr std::size_t kStagedOctetsUnsent = std::size_t{512} << 10;
// Free staging buffers a thread keeps for the next copies (any QP's): one
// QP's worth and as much again. Freeing them at every idle point made every
// batch allocate (and zero-fill) them again (performance-notes 3.17).
constexpr std::size_t kPooledStagingOctetsPerThread = 2 * kStagedOctetsUnsent;

// The scatter list of one sendmsg, emptied. Write fills it and hands it to
// the kernel before any callback can run, so one per thread serves every QP
// (32 KiB per thread instead of per QP).
transport::SendList& ThreadSendList() {
  thread_local const std::unique_ptr<transport::SendList> list =
      std::make_unique<transport::SendList>();
  list->Clear();
  return *list;
}

rdmap::Opcode SendOpcodeOnWire(const SendWrFields& wr) {
  const bool se = wr.solicited_event();
  if (wr.invalidates_remote()) {
    return se ? rdmap::Opcode::kSendWithSeAndInvalidate : rdmap::Opcode::kSendWithInvalidate;
  }
  return se ? rdmap::Opcode::kSendWithSe : rdmap::Opcode::kSend;
}

}  // namespace

QpTx::QpTx(QpForTx& qp) : qp_(qp) {}
QpTx::~QpTx() = default;

void QpTx::Start(const StreamParams& params, std::size_t max_ulpdu) {
  Stop();
  params_ = params;
  max_ulpdu_ = max_ulpdu;
  mpa::FpduFramingConfig framing;
  framing.crc_enabled = params.crc_enabled;
  framing.markers_enabled = params.tx_markers;
  framing.marker_grid_offset = params.tx_marker_grid_offset;
  framer_.emplace(framing);
  tx_grid_start_ = params.tx_marker_grid_offset % mpa::kMarkerInterval;
  wire_written_ = 0;
  slot_count_ = std::clamp(kBatchOctets / max_ulpdu, kMinSlots, kMaxSlots);
  slots_ = std::make_unique<std::unique_ptr<Slot>[]>(slot_count_);
  allocated_slots_ = 0;
  first_ = 0;
  in_flight_ = 0;
  cur_ = Message{};
  send_msn_ = 1;
  read_msn_ = 1;
  rtr_sent_ = false;
  response_turn_ = true;
  mode_ = Mode::kOpen;
  terminate_.reset();
  terminate_framed_ = false;
  fin_sent_ = false;
  // From the head: WRs queued in RTR before the stream (out-of-band
  // connect) go first. Otherwise the SQ is empty here (head == tail).
  tx_seq_ = qp_.SqHead();
  started_ = true;
}

void QpTx::Stop() {
  ReleaseRefs();
  slots_.reset();
  staged_unsent_ = 0;
  slot_count_ = 0;
  allocated_slots_ = 0;
  first_ = 0;
  in_flight_ = 0;
  cur_ = Message{};
  framer_.reset();
  started_ = false;
  mode_ = Mode::kDone;
}

bool QpTx::Pump() {
  if (!started_ || mode_ == Mode::kDone || qp_.stream() == nullptr) return false;
  std::size_t budget = kPumpBudget;
  bool more = false;
  for (;;) {
    CheckMailbox();
    Fill();
    if (mode_ == Mode::kDone) break;
    if (in_flight_ == 0) {
      if (mode_ == Mode::kDraining || mode_ == Mode::kStopping ||
          (mode_ == Mode::kTerminating && terminate_framed_)) {
        FinishWinding();
      } else {
        qp_.SetWriteInterest(false);
        qp_.NoteTxIdle();
        ReleaseIdleSlots();
      }
      break;
    }
    if (budget == 0) {
      more = true;
      break;
    }
    if (!Write(budget)) break;
  }
  // Never hold a region across waiting for the network (memory.h).
  ReleaseRefs();
  return more && mode_ != Mode::kDone;
}

void QpTx::CheckMailbox() {
  std::optional<TxMail> mail = qp_.TakeMail();
  if (!mail) return;
  std::optional<rdmap::TerminateHeader> terminate = std::move(mail->terminate);
  const TxClose close = mail->close;
  if (mode_ == Mode::kDone || mode_ == Mode::kTerminating) return;
  if (terminate) {
    // The Terminate follows what is already framed (FPDUs are never cut),
    // and ends the message in progress (RFC 5040 7.1).
    terminate_ = std::move(terminate);
    mode_ = Mode::kTerminating;
    cur_ = Message{};
  } else if (close == TxClose::kStop) {
    mode_ = Mode::kStopping;
    cur_ = Message{};
  } else if (close == TxClose::kGraceful && mode_ == Mode::kOpen) {
    mode_ = Mode::kDraining;
  }
}

void QpTx::Fill() {
  while (started_ && in_flight_ < slot_count_ && mode_ != Mode::kDone) {
    CheckMailbox();
    if (mode_ == Mode::kTerminating) {
      if (!terminate_framed_) FrameTerminate();
      return;
    }
    if (cur_.kind != MessageKind::kNone) {
      if (StagingFull()) return;  // sendmsg first, then copy into what it read
      if (!FrameSegment()) return;
      continue;
    }
    if (mode_ == Mode::kStopping) return;
    if (!StartNextMessage()) return;
  }
}

bool QpTx::StartNextMessage() {
  // RTS starts messages; a graceful close (SQD/Closing) still sends what was
  // posted before it.
  const QpState state = qp_.state();
  if (!ProcessesSendQueue(state) && !(mode_ == Mode::kDraining && state == QpState::kClosing)) {
    return false;
  }
  if (params_.rtr_role == RtrRole::kSend && !rtr_sent_) {
    FrameRtr();
    return true;
  }
  // RFC 6581 7.1: the side that waits for the RTR sends nothing before it.
  if (!qp_.RtrReceived()) return false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool response = response_turn_ == (attempt == 0);
    if (response ? StartResponse() : StartSqMessage()) {
      response_turn_ = !response;
      return true;
    }
  }
  return false;
}

bool QpTx::StartResponse() {
  const std::optional<IrqEntry> request = qp_.TakeReadRequest();
  if (!request) return false;
  const IrqEntry& entry = *request;
  cur_ = Message{};
  cur_.kind = MessageKind::kResponse;
  cur_.response = entry;
  cur_.total = entry.size;
  return true;
}

bool QpTx::StartSqMessage() {
  const std::uint64_t seq = tx_seq_;
  // Null at the tail, or posted in a flush state: never started, flushed
  // at finalization.
  const SqPeek peek = qp_.PeekSq(seq);
  if (peek.wr == nullptr) return false;
  const SendRecord* wr = peek.wr;
  const std::size_t orq_size = peek.reads_outstanding;
  // A fenced WR waits for every earlier RDMA Read to complete.
  if ((wr->flags & kSendFence) != 0 && orq_size > 0) return false;

  MemoryTable& memory = qp_.memory();
  const PdId pd = qp_.pd();
  switch (wr->opcode) {
    case SendOpcode::kLocalInvalidate: {
      ++tx_seq_;
      if (memory.InvalidateLocal(wr->invalidate_stag, pd) != InvalidateStatus::kOk) {
        FailSq(seq, WcStatus::kLocProtErr);
        return true;
      }
      qp_.MarkSqDone(seq);
      ReleaseRefs();
      qp_.RetireSq();
      return true;
    }
    case SendOpcode::kRdmaRead: {
      if (params_.ord == 0) {
        ++tx_seq_;
        FailSq(seq, WcStatus::kLocQpOpErr);  // no Read may be outstanding at all
        return true;
      }
      if (orq_size >= params_.ord) return false;  // ORD reached: wait for a response
      const std::uint32_t length = wr->num_sge > 0 ? wr->sges()[0].length : 0;
      // The sink is a tagged buffer the peer writes (RFC 5040 5.2).
      if (length > 0 && !memory.Check(wr->sges()[0].lkey, pd, AccessKind::kRemoteWrite,
                                      wr->sges()[0].addr, length)
                             .ok()) {
        ++tx_seq_;
        FailSq(seq, WcStatus::kLocProtErr);
        return true;
      }
      ++tx_seq_;
      FrameReadRequest(*wr, seq);
      return true;
    }
    default:
      break;
  }
  // Send variants and RDMA Write.
  const std::uint64_t total = wr->total_length();
  if (total > kMaxMessageSize) {
    ++tx_seq_;
    FailSq(seq, WcStatus::kLocLenErr);
    return true;
  }
  if (!wr->is_inline()) {
    for (const Sge& sge : wr->sges()) {
      if (sge.length == 0) continue;
      if (RegionCovers(pin_.get(), sge.lkey, pd, AccessKind::kLocalRead, sge.addr, sge.length)) {
        continue;
      }
      AccessCheckResult check =
          memory.Check(sge.lkey, pd, AccessKind::kLocalRead, sge.addr, sge.length);
      if (!check.ok()) {
        ++tx_seq_;
        FailSq(seq, WcStatus::kLocProtErr);
        return true;
      }
      // Held for the rest of the turn like GatherPayload's pin, so the
      // segments framed from this WR need no second lookup (a probe of the
      // table and the thread's hazard word, docs/performance-notes.md 3.18,
      // 3.23).
      if (!pin_) pin_ = std::move(check.region);
    }
  }
  ++tx_seq_;
  cur_ = Message{};
  cur_.kind = MessageKind::kSq;
  cur_.wr = wr;
  cur_.seq = seq;
  cur_.total = total;
  if (wr->IsSend()) {
    cur_.msn = send_msn_++;
    qp_.SetSqMsn(seq, cur_.msn);
  }
  return true;
}

// One pool for all threads: a QP's slots are taken by the thread that frames
// (the posting application's or the progress thread) and given back by the
// one that finds the QP idle, often the other. With a cache per thread, the
// progress thread's overflowed and freed slots while the posting thread
// allocated one for most FPDUs (performance-notes 3.35). An application
// thread must not allocate per message at all: an application's signal
// handler that allocates would deadlock on the allocator lock it interrupted.
struct QpTx::SlotPool {
  std::mutex mutex;
  std::vector<std::unique_ptr<Slot>> slots;  // guarded by mutex; most recently idle last
};

QpTx::SlotPool& QpTx::IdleSlots() {
  // Never destroyed: QPs may be torn down after static destructors ran.
  static SlotPool* const pool = [] {
    auto* created = new SlotPool;
    created->slots.reserve(kPooledSlots);
    // A child of fork() must not inherit the mutex held by a thread it does
    // not have.
    pthread_atfork([] { IdleSlots().mutex.lock(); }, [] { IdleSlots().mutex.unlock(); },
                   [] { IdleSlots().mutex.unlock(); });
    return created;
  }();
  return *pool;
}

std::vector<QpTx::StagingBuffer>& QpTx::StagingPool() {
  thread_local std::vector<StagingBuffer> pool;
  return pool;
}

std::size_t& QpTx::PooledStagingOctets() {
  thread_local std::size_t octets = 0;
  return octets;
}

void QpTx::ReleaseIdleSlots() {
  static_assert(kKeptSlots == 1, "the kept slot is slot 0, where the next FPDU goes");
  first_ = 0;
  if (allocated_slots_ > kKeptSlots) {
    std::size_t idle = 0;
    for (std::size_t i = kKeptSlots; i < slot_count_; ++i) {
      std::unique_ptr<Slot>& slot = slots_[i];
      if (!slot) continue;
      if (!slots_[0]) {  // keep one at the front, where the next FPDU goes
        slots_[0] = std::move(slot);
        continue;
      }
      slot->DropSources();
      ReturnStaging(*slot);
      ++idle;
    }
    SlotPool& pool = IdleSlots();
    std::lock_guard lock(pool.mutex);
    for (std::size_t i = kKeptSlots; idle > 0 && i < slot_count_; ++i) {
      std::unique_ptr<Slot>& slot = slots_[i];
      if (!slot) continue;
      if (pool.slots.size() < kPooledSlots) {
        pool.slots.push_back(std::move(slot));
      } else {
        slot.reset();
      }
      --allocated_slots_;
      --idle;
    }
  }
  if (slots_[0]) ReturnStaging(*slots_[0]);
}

QpTx::Slot& QpTx::NewSlot() {
  std::unique_ptr<Slot>& entry = slots_[(first_ + in_flight_) % slot_count_];
  if (!entry) {
    SlotPool& pool = IdleSlots();
    {
      std::lock_guard lock(pool.mutex);
      if (!pool.slots.empty()) {
        entry = std::move(pool.slots.back());
        pool.slots.pop_back();
      }
    }
    if (!entry) entry = std::make_unique<Slot>();
    ++allocated_slots_;
  }
  Slot& slot = *entry;
  slot.DropSources();
  ReturnStaging(slot);  // from an FPDU dropped unsent
  slot.sent = 0;
  slot.role = Role::kSqSegment;
  slot.last = false;
  slot.seq = 0;
  slot.source_kind = AccessKind::kLocalRead;
  return slot;
}

bool QpTx::FrameInto(Slot& slot, std::size_t header_length, std::span<const ByteSpan> payload,
                     std::uint8_t* copy_to) {
  const ByteSpan header(slot.header.data(), header_length);
  const mpa::FrameStatus status = copy_to != nullptr
                                      ? framer_->FrameCopy(header, payload, copy_to, slot.frame)
                                      : framer_->Frame(header, payload, slot.frame);
  if (status != mpa::FrameStatus::kOk) {
    // Segments are sized to fit; this is an engine bug, not a peer's.
    for (std::size_t i = 0; i < slot.source_count; ++i) slot.refs[i].Release();
    ReleaseRefs();
    ErrorReport report;
    report.cause = rdmap::TerminateCause::RdmapLocalCatastrophic();
    report.event = AsyncEventType::kQpFatal;
    report.abort = true;
    qp_.RaiseError(report);
    mode_ = Mode::kDone;
    return false;
  }
  ++in_flight_;
  return true;
}

bool QpTx::GatherPayload(Slot& slot, std::uint64_t offset, std::size_t length,
                         std::array<ByteSpan, kMaxSge>& pieces, std::size_t& piece_count,
                         AccessStatus& failure) {
  piece_count = 0;
  slot.source_count = 0;
  if (length == 0) return true;
  MemoryTable& memory = qp_.memory();
  const PdId pd = qp_.pd();
  auto add = [&](std::uint32_t stag, std::uint64_t to, std::size_t n, AccessKind kind) {
    const std::size_t i = slot.source_count;
    slot.refs[i].Release();  // none expected: a slot is emptied when reused
    if (!RegionCovers(pin_.get(), stag, pd, kind, to, n)) {
      AccessCheckResult check = memory.Check(stag, pd, kind, to, n);
      if (!check.ok()) {
        failure = check.status;
        return false;
      }
      if (pin_) {
        slot.refs[i] = std::move(check.region);
      } else {
        pin_ = std::move(check.region);
      }
    }
    const MemoryRegion* region = slot.refs[i] ? slot.refs[i].get() : pin_.get();
    slot.source_count = static_cast<std::uint8_t>(i + 1);
    slot.sources[i] = Source{stag, to, static_cast<std::uint32_t>(n)};
    pieces[piece_count++] = ByteSpan(region->HostPointer(to), n);
    slot.refs_held = true;
    return true;
  };

  if (cur_.kind == MessageKind::kResponse) {
    slot.source_kind = AccessKind::kRemoteRead;
    return add(cur_.response.source_stag, cur_.response.source_to + offset, length,
               AccessKind::kRemoteRead);
  }
  const SendRecord& wr = *cur_.wr;
  slot.source_kind = AccessKind::kLocalRead;
  if (wr.is_inline()) {
    pieces[piece_count++] = wr.inline_bytes().subspan(offset, length);
    return true;
  }
  std::uint64_t position = 0;  // message offset of the current SGE
  std::size_t left = length;
  for (const Sge& sge : wr.sges()) {
    if (left == 0) break;
    const std::uint64_t end = position + sge.length;
    if (offset < end && sge.length > 0) {
      const std::uint64_t inner = offset - position;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(sge.length - inner, left));
      if (!add(sge.lkey, sge.addr + inner, n, AccessKind::kLocalRead)) return false;
      offset += n;
      left -= n;
    }
    position = end;
  }
  return true;
}

bool QpTx::FrameSegment() {
  Slot& slot = NewSlot();
  rdmap::DdpRdmapHeader header;
  std::size_t room;
  bool tagged;
  if (cur_.kind == MessageKind::kSq && cur_.wr->IsSend()) {
    tagged = false;
    room = max_ulpdu_ - rdmap::kDdpUntaggedHeaderSize;
  } else {
    tagged = true;
    room = max_ulpdu_ - rdmap::kDdpTaggedHeaderSize;
  }
  const std::uint64_t left = cur_.total - cur_.offset;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, room));
  const bool last = cur_.offset + n == cur_.total;

  if (cur_.kind == MessageKind::kSq) {
    const SendRecord& wr = *cur_.wr;
    if (!tagged) {
      // Untagged: QN 0, the message's MSN, MO = octets before this segment
      // (RFC 5041 4.3, RFC 5040 5.3).
      header = rdmap::MakeHeader(SendOpcodeOnWire(wr), last);
      header.msn = cur_.msn;
      header.mo = static_cast<std::uint32_t>(cur_.offset);
      if (wr.invalidates_remote()) header.invalidate_stag = wr.invalidate_stag;
    } else {
      // Tagged: the Data Sink's STag and a TO advancing per segment (RFC 5041 4.2).
      header = rdmap::MakeHeader(rdmap::Opcode::kRdmaWrite, last);
      header.stag = wr.rkey;
      header.to = wr.remote_addr + cur_.offset;
    }
    slot.role = Role::kSqSegment;
    slot.seq = cur_.seq;
  } else {
    header = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, last);
    header.stag = cur_.response.sink_stag;
    header.to = cur_.response.sink_to + cur_.offset;
    slot.role = Role::kResponseSegment;
  }
  slot.last = last;

  std::array<ByteSpan, kMaxSge> pieces;
  std::size_t piece_count = 0;
  AccessStatus failure = AccessStatus::kOk;
  if (!GatherPayload(slot, cur_.offset, n, pieces, piece_count, failure)) {
    for (std::size_t i = 0; i < slot.source_count; ++i) slot.refs[i].Release();
    slot.source_count = 0;
    if (cur_.kind == MessageKind::kSq) {
      const std::uint64_t seq = cur_.seq;
      cur_ = Message{};
      FailSq(seq, WcStatus::kLocProtErr);
    } else {
      cur_ = Message{};
      FailResponse(failure);
    }
    return false;
  }
  const bool staged = cur_.kind == MessageKind::kResponse && params_.crc_enabled;
  const rdmap::EncodeResult encoded = rdmap::EncodeDdpRdmapHeader(header, slot.header);
  std::uint8_t* const copy_to =
      staged ? StagingFor(slot, mpa::UnmarkedFpduLength(encoded.length + n)) : nullptr;
  if (!FrameInto(slot, encoded.length, std::span<const ByteSpan>(pieces.data(), piece_count),
                 copy_to)) {
    return false;
  }
  if (staged) slot.DropSources();  // the frame points at the copy
  cur_.offset += n;
  // A Read Response leaves the IRD count only when sendmsg has taken its
  // last octet (Advance), not here: until then the peer cannot have it.
  if (last) cur_ = Message{};
  return true;
}

void QpTx::FrameRtr() {
  Slot& slot = NewSlot();
  rdmap::DdpRdmapHeader header;
  switch (params_.rtr_message) {
    case RtrMessage::kSend:
      header = rdmap::MakeHeader(rdmap::Opcode::kSend, true);
      header.msn = send_msn_++;
      break;
    case RtrMessage::kWrite:
      header = rdmap::MakeHeader(rdmap::Opcode::kRdmaWrite, true);
      break;
    case RtrMessage::kRead: {
      header = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadRequest, true);
      header.msn = read_msn_++;
      header.body = rdmap::ReadRequestBody{};
      OrqEntry entry;
      entry.msn = header.msn;
      entry.rtr = true;
      qp_.PushOrq(entry);
      break;
    }
  }
  slot.role = Role::kRtr;
  slot.last = true;
  const rdmap::EncodeResult encoded = rdmap::EncodeDdpRdmapHeader(header, slot.header);
  rtr_sent_ = true;
  FrameInto(slot, encoded.length, {});
}

void QpTx::FrameReadRequest(const SendRecord& wr, std::uint64_t seq) {
  Slot& slot = NewSlot();
  rdmap::ReadRequestBody body;
  if (wr.num_sge > 0) {
    body.sink_stag = wr.sges()[0].lkey;
    body.sink_to = wr.sges()[0].addr;
    body.read_size = wr.sges()[0].length;
  }
  body.source_stag = wr.rkey;
  body.source_to = wr.remote_addr;
  rdmap::DdpRdmapHeader header = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadRequest, true);
  header.msn = read_msn_++;
  header.body = body;
  {
    // In the ORQ before it can be on the wire, so its response always finds it.
    OrqEntry entry;
    entry.seq = seq;
    entry.msn = header.msn;
    entry.sink_stag = body.sink_stag;
    entry.sink_to = body.sink_to;
    entry.size = body.read_size;
    qp_.PushOrq(entry);
  }
  slot.role = Role::kReadRequest;
  slot.seq = seq;
  slot.last = true;
  const rdmap::EncodeResult encoded = rdmap::EncodeDdpRdmapHeader(header, slot.header);
  FrameInto(slot, encoded.length, {});
}

void QpTx::FrameTerminate() {
  Slot& slot = NewSlot();
  // Terminate on QN 2 with MSN 1: the only message ever sent there.
  rdmap::EncodeResult encoded = rdmap::EncodeTerminateMessage(*terminate_, 1, slot.header);
  if (encoded.status != rdmap::EncodeStatus::kOk) {
    terminate_ = rdmap::MakeTerminate(terminate_->cause);
    encoded = rdmap::EncodeTerminateMessage(*terminate_, 1, slot.header);
  }
  slot.role = Role::kTerminate;
  slot.last = true;
  terminate_framed_ = true;
  FrameInto(slot, encoded.length, {});
}

std::uint8_t* QpTx::StagingFor(Slot& slot, std::size_t octets) {
  ReturnStaging(slot);
  std::vector<StagingBuffer>& pool = StagingPool();
  if (!pool.empty()) {
    slot.staging = std::move(pool.back());
    pool.pop_back();
    PooledStagingOctets() -= slot.staging.capacity;
  }
  if (slot.staging.capacity < octets) {
    // Every segment of a stream has the same room (an FPDU of max ULPDU),
    // so this happens about once per thread and size.
    const std::size_t capacity = std::max(octets, mpa::UnmarkedFpduLength(max_ulpdu_));
    slot.staging.octets = std::make_unique_for_overwrite<std::uint8_t[]>(capacity);
    slot.staging.capacity = capacity;
  }
  slot.staged_octets = octets;
  staged_unsent_ += octets;
  return slot.staging.octets.get();
}

void QpTx::ReturnStaging(Slot& slot) {
  if (!slot.staging.octets) return;
  staged_unsent_ -= std::min(staged_unsent_, slot.staged_octets);
  slot.staged_octets = 0;
  std::size_t& pooled = PooledStagingOctets();
  if (pooled + slot.staging.capacity <= kPooledStagingOctetsPerThread) {
    pooled += slot.staging.capacity;
    StagingPool().push_back(std::move(slot.staging));
  }
  slot.staging = StagingBuffer{};
}

bool QpTx::StagingFull() const {
  // Only with something in flight, so that a sendmsg is due to make room.
  return params_.crc_enabled && cur_.kind == MessageKind::kResponse && in_flight_ > 0 &&
         staged_unsent_ >= kStagedOctetsUnsent;
}

bool QpTx::AcquireRefs(Slot& slot, AccessStatus& failure) {
  if (slot.refs_held || slot.source_count == 0) return true;
  MemoryTable& memory = qp_.memory();
  const PdId pd = qp_.pd();
  for (std::size_t i = 0; i < slot.source_count; ++i) {
    const Source& s = slot.sources[i];
    if (RegionCovers(pin_.get(), s.stag, pd, slot.source_kind, s.to, s.length)) continue;
    AccessCheckResult check = memory.Check(s.stag, pd, slot.source_kind, s.to, s.length);
    if (!check.ok()) {
      for (std::size_t j = 0; j < i; ++j) slot.refs[j].Release();
      failure = check.status;
      return false;
    }
    // A stale STag never names a new region, so the framed pointers still
    // point into this one.
    if (pin_) {
      slot.refs[i] = std::move(check.region);
    } else {
      pin_ = std::move(check.region);
    }
  }
  slot.refs_held = true;
  return true;
}

void QpTx::ReleaseRefs() {
  pin_.Release();
  if (!slots_) return;
  for (std::size_t k = 0; k < in_flight_; ++k) {
    Slot& slot = *slots_[(first_ + k) % slot_count_];
    if (!slot.refs_held) continue;
    for (std::size_t i = 0; i < slot.source_count; ++i) slot.refs[i].Release();
    slot.refs_held = false;
  }
}

void QpTx::ResetFramerAtSentPosition() {
  std::uint64_t position = tx_grid_start_ + wire_written_;
  for (std::size_t k = 0; k < in_flight_; ++k) {
    const Slot& slot = *slots_[(first_ + k) % slot_count_];
    position += slot.frame.wire_length() - slot.sent;
  }
  mpa::FpduFramingConfig framing = framer_->config();
  framing.marker_grid_offset = static_cast<std::uint32_t>(position % mpa::kMarkerInterval);
  framer_.emplace(framing);
}

bool QpTx::Write(std::size_t& budget) {
  // Re-check every region an unsent octet comes from.
  for (std::size_t k = 0; k < in_flight_; ++k) {
    Slot& slot = *slots_[(first_ + k) % slot_count_];
    AccessStatus failure = AccessStatus::kOk;
    if (AcquireRefs(slot, failure)) continue;
    if (slot.sent > 0) {
      // Half an FPDU is on the wire and the rest may no longer be read.
      AbortStream(rdmap::TerminateCause::RdmapLocalCatastrophic());
      return false;
    }
    // Drop this FPDU and everything framed after it, then end the stream.
    const Role role = slot.role;
    const std::uint64_t seq = slot.seq;
    for (std::size_t j = k; j < in_flight_; ++j) {
      Slot& dropped = *slots_[(first_ + j) % slot_count_];
      for (std::size_t i = 0; i < dropped.source_count; ++i) dropped.refs[i].Release();
      dropped.refs_held = false;
      ReturnStaging(dropped);
    }
    in_flight_ = k;
    ResetFramerAtSentPosition();
    cur_ = Message{};
    if (role == Role::kResponseSegment) {
      FailResponse(failure);
    } else {
      FailSq(seq, WcStatus::kLocProtErr);
    }
    return true;  // frame the Terminate next
  }

  transport::SendList& list = ThreadSendList();
  for (std::size_t k = 0; k < in_flight_ && !list.full(); ++k) {
    if (!AppendUnsent(*slots_[(first_ + k) % slot_count_], list)) break;
  }
  const std::size_t total = list.octets();
  // From before sendmsg until its octets are accounted, the receive side
  // must not judge the peer's Read Requests against the IRD count (Qp::
  // WaitForSendAccounting): a response may be on its way already.
  qp_.BeginSendAccounting();
  const transport::IoResult result = qp_.stream()->WriteV(list.iovecs());
  bool sq_done = false;
  if (result.status == transport::IoStatus::kOk) sq_done = Advance(result.bytes);
  qp_.EndSendAccounting();
  // Completions run callbacks, which may drive the receive side.
  if (sq_done) {
    ReleaseRefs();  // the callbacks may deregister (see the top of tx.h)
    qp_.RetireSq();
  }
  switch (result.status) {
    case transport::IoStatus::kOk:
      CounterAdd(qp_.counters().tx_syscalls, 1);
      CounterAdd(qp_.counters().tx_octets, result.bytes);
      budget -= std::min(budget, result.bytes);
      if (result.bytes == total) {
        // The socket took everything: it has room, so EPOLLOUT (level-
        // triggered) would wake the progress thread over and over while
        // an application thread keeps transmitting inline: 20 000-80 000
        // epoll_wait calls a second on loopback (performance-notes 3.13).
        // A later call that finds it full arms the interest again, and
        // every other way out of Pump leaves nothing for EPOLLOUT to do.
        qp_.SetWriteInterest(false);
        return true;
      }
      break;  // the socket is full
    case transport::IoStatus::kWouldBlock:
      break;
    case transport::IoStatus::kClosed:
    case transport::IoStatus::kError: {
      AbortStream(rdmap::TerminateCause::MpaConnectionLost());
      return false;
    }
  }
  CounterAdd(qp_.counters().tx_would_block, 1);
  if (!qp_.SetWriteInterest(true)) {
    // The poller dropped the socket (the peer closed): nobody would tell us
    // when it drains, so give up on it.
    AbortStream(rdmap::TerminateCause::MpaConnectionLost());
  }
  return false;
}

void QpTx::AbortStream(const rdmap::TerminateCause& cause) {
  ErrorReport report;
  report.cause = cause;
  report.event = AsyncEventType::kQpFatal;
  report.abort = true;
  ReleaseRefs();
  if (!qp_.RaiseError(report)) qp_.EndStream(/*abort=*/true);
  mode_ = Mode::kDone;
}

bool QpTx::Advance(std::size_t octets) {
  wire_written_ += octets;
  bool sq_done = false;
  std::uint32_t responses_sent = 0;
  while (octets > 0 && in_flight_ > 0) {
    Slot& slot = *slots_[first_];
    const std::size_t remaining = slot.frame.wire_length() - slot.sent;
    const std::size_t take = std::min(remaining, octets);
    slot.sent += take;
    octets -= take;
    if (slot.sent < slot.frame.wire_length()) break;
    for (std::size_t i = 0; i < slot.source_count; ++i) slot.refs[i].Release();
    slot.refs_held = false;
    ReturnStaging(slot);  // the kernel has the octets: the next copy goes here
    CounterAdd(qp_.counters().tx_fpdus, 1);
    if (slot.role == Role::kSqSegment && slot.last) {
      // A Send or Write completes once TCP has taken all of it (RFC 5040 5.5).
      qp_.MarkSqDone(slot.seq);
      sq_done = true;
    }
    if (slot.role == Role::kResponseSegment && slot.last) ++responses_sent;
    first_ = (first_ + 1) % slot_count_;
    --in_flight_;
  }
  if (responses_sent > 0) {
    // The kernel has every octet of these responses: their requests no
    // longer count against the IRD (RFC 5040 5.2.2, QN 1 buffers).
    qp_.ResponsesSent(responses_sent);
  }
  return sq_done;
}

void QpTx::FailSq(std::uint64_t seq, WcStatus status) {
  // A local error on a WR moves the QP to ERR; the peer learns of it from a
  // Local Catastrophic Terminate (RFC 5040 7.1 rule 1, not tied to an
  // incoming message).
  ReleaseRefs();  // completions follow (see the top of tx.h)
  ErrorReport report;
  report.cause = rdmap::TerminateCause::RdmapLocalCatastrophic();
  report.terminate = rdmap::MakeTerminate(report.cause);
  report.failed_seq = seq;
  report.failed_status = status;
  qp_.RaiseError(report);
  CheckMailbox();
}

void QpTx::FailResponse(AccessStatus status) {
  // The source of a Read we accepted stopped being readable (deregistered
  // or invalidated meanwhile): the Read fails as if checked now.
  ReleaseRefs();
  ErrorReport report;
  report.cause = ReadSourceCause(status);
  report.terminate = rdmap::MakeTerminate(report.cause);
  report.event = AsyncEventType::kQpAccessError;
  qp_.RaiseError(report);
  CheckMailbox();
}

void QpTx::FinishWinding() {
  // The Terminate (if any) and everything before it is out: FIN (RFC 5040
  // 7.1: the stream is closed after the Terminate).
  qp_.stream()->ShutdownWrite();
  fin_sent_ = true;
  mode_ = Mode::kDone;
  qp_.SetWriteInterest(false);
  qp_.EndStream(/*abort=*/false);
}

bool QpTx::AppendUnsent(const Slot& slot, transport::SendList& list) {
  std::size_t skip = slot.sent;
  for (const mpa::IoSlice& s : slot.frame.slices()) {
    if (skip >= s.len) {
      skip -= s.len;
      continue;
    }
    if (!list.Add(s.base + skip, s.len - skip)) return false;
    skip = 0;
  }
  return true;
}

bool QpTx::FinishStartedFpdu() {
  if (!started_ || !slots_ || in_flight_ == 0 || qp_.stream() == nullptr) return true;
  Slot& slot = *slots_[first_];
  if (slot.sent == 0) return true;
  AccessStatus failure = AccessStatus::kOk;
  if (!AcquireRefs(slot, failure)) return false;  // its source is gone: only an RST is clean
  constexpr int kTries = 4;
  for (int attempt = 0; attempt < kTries && slot.sent < slot.frame.wire_length(); ++attempt) {
    transport::SendList& list = ThreadSendList();
    AppendUnsent(slot, list);
    const transport::IoResult result = qp_.stream()->WriteV(list.iovecs());
    if (result.status != transport::IoStatus::kOk) break;
    slot.sent += result.bytes;
    CounterAdd(qp_.counters().tx_octets, result.bytes);
  }
  ReleaseRefs();
  return slot.sent == slot.frame.wire_length();
}

}  // namespace siwx::engine
