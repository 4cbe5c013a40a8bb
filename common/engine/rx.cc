// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/rx.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/engine/engine.h"
#include "common/engine/qp.h"

namespace siwx::engine {
namespace {

// recvmsg calls one readable event may make before yielding to other QPs.
constexpr int kReadsPerTurn = 64;

bool IsSendOpcode(rdmap::Opcode op) {
  return op == rdmap::Opcode::kSend || op == rdmap::Opcode::kSendWithInvalidate ||
         op == rdmap::Opcode::kSendWithSe || op == rdmap::Opcode::kSendWithSeAndInvalidate;
}

// One staging buffer per thread that runs receive turns (the progress
// thread, and application threads polling a CQ): kStagingSize per thread
// instead of per QP. A turn nested in another on the same thread (not
// expected: DriveFromPoll refuses nesting) gets a buffer of its own.
thread_local std::vector<std::uint8_t> tls_staging;
thread_local bool tls_staging_busy = false;

class StagingLease {
 public:
  StagingLease() : nested_(tls_staging_busy) {
    std::vector<std::uint8_t>& buffer = nested_ ? own_ : tls_staging;
    if (buffer.size() != QpRx::kStagingSize) buffer.resize(QpRx::kStagingSize);
    tls_staging_busy = true;
  }
  ~StagingLease() {
    if (!nested_) tls_staging_busy = false;
  }
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  MutableByteSpan span() { return nested_ ? MutableByteSpan(own_) : MutableByteSpan(tls_staging); }

 private:
  bool nested_;
  std::vector<std::uint8_t> own_;
};

}  // namespace

QpRx::QpRx(QpForRx& qp) : qp_(qp) {}
QpRx::~QpRx() = default;

void QpRx::Start(const StreamParams& params) {
  Stop();
  params_ = params;
  mpa::FpduParserConfig config;
  config.crc_enabled = params.crc_enabled;
  config.markers_enabled = params.rx_markers;
  config.marker_grid_offset = params.rx_marker_grid_offset;
  config.header_sizer = &rdmap::UlpduHeaderLength;
  parser_.emplace(config);
  staging_ = {};
  staged_begin_ = 0;
  staged_end_ = 0;
  segment_ = Segment::kNone;
  pending_.reset();
  send_active_ = false;
  send_msn_ = 1;
  send_received_ = 0;
  recv_wr_.reset();
  read_msn_ = 1;
  responses_owed_ = false;
  response_active_ = false;
  response_received_ = 0;
  terminate_length_ = 0;
  last_boundary_ = 0;
  last_fpdu_large_ = false;
  small_follower_octets_ = 0;
  awaiting_rtr_ = params.rtr_role == RtrRole::kAwait;
  started_ = true;
  stopped_ = false;
  eof_ = false;
}

void QpRx::Stop() {
  ReleaseRefs();
  ReleasePin();
  parser_.reset();
  recv_wr_.reset();
  send_active_ = false;
  response_active_ = false;
  started_ = false;
  stopped_ = true;
}

void QpRx::AbandonMessage(WcStatus status) {
  ReleasePin();
  if (recv_wr_) {
    WorkCompletion wc;
    wc.wr_id = recv_wr_->wr_id;
    wc.status = status;
    wc.opcode = WcOpcode::kRecv;
    wc.qp_num = qp_.qp_num();
    recv_wr_.reset();
    qp_.CompleteReceive(wc, false);
  }
  send_active_ = false;
  response_active_ = false;
}

// ---- Reading ----

void QpRx::OnReadable(transport::TcpStream& stream) {
  if (!started_ || eof_) return;
  StagingLease lease;
  staging_ = lease.span();
  // Octets a previous turn left staged were in another buffer; only an
  // error leaves any, and the turn after an error reads nothing of them.
  staged_begin_ = 0;
  staged_end_ = 0;
  OnReadableTurn(stream);
  staging_ = {};
}

void QpRx::OnReadableTurn(transport::TcpStream& stream) {
  if (stopped_ || !ProcessesInbound(qp_.state())) {
    stopped_ = true;
    Drain(stream);
    return;
  }
  socket_drained_ = false;
  for (int reads = 0; reads < kReadsPerTurn;) {
    if (!ProcessesInbound(qp_.state())) stopped_ = true;
    if (stopped_) break;
    if (Staged() > 0) {
      if (!ConsumeStaged()) break;
      continue;
    }
    staged_begin_ = 0;
    staged_end_ = 0;
    ReleasePin();  // held for the octets of one read only
    // Everything read so far is processed: answer its Read Requests before
    // reading more (see SendOwedResponses).
    SendOwedResponses();
    // A short read found the socket empty; the level-triggered poller tells
    // us when more arrives, which saves a recvmsg that would only say EAGAIN.
    if (socket_drained_) break;
    const mpa::RxDemand demand = parser_->Demand();
    if (demand.kind == mpa::RxDemand::Kind::kFailed) break;
    // Large payloads go straight into their targets: a demand that is
    // large, or the rest of a large FPDU's payload (after a staged read or
    // a short direct one ended inside it). So does the payload of a small
    // FPDU right after a large one (the last segment of a large message):
    // a 64 KiB staged read there would pull the next large FPDU in and copy
    // it. A stream of large FPDUs so stays at one recvmsg per FPDU and no
    // copy. With markers every demand stops at the next marker (at most 512
    // octets apart): staged.
    const bool large_fpdu = !params_.rx_markers && (LargeFpdu() || last_fpdu_large_);
    const bool direct = demand.kind == mpa::RxDemand::Kind::kPayload &&
                        segment_ != Segment::kTerminate &&
                        (demand.length >= kDirectPlacementMin || large_fpdu);
    const ReadOutcome outcome =
        direct ? ReadPayloadDirect(stream, demand) : ReadIntoStaging(stream);
    ++reads;
    if (outcome != ReadOutcome::kProgress) break;
  }
  // Octets already read are ours to process: the poller only reports what
  // is still in the socket.
  if (!stopped_ && Staged() > 0) ConsumeStaged();
  ReleaseRefs();
  ReleasePin();
  SendOwedResponses();
  // After an error, read and drop so the level-triggered poller quiets.
  if (stopped_ && !eof_) Drain(stream);
}

void QpRx::SendOwedResponses() {
  // Read Requests are answered once per read, not one by one: every request
  // that came in the same read (or an earlier one not yet answered) finds
  // the ones before it outstanding, so a peer that sends more than IRD
  // requests without waiting for responses is caught however small they
  // are. A peer that keeps to its ORD cannot send a request before it got
  // the response it waits for, which leaves only after this kick.
  if (!responses_owed_) return;
  responses_owed_ = false;
  if (!stopped_) qp_.KickTx();
}

void QpRx::Drain(transport::TcpStream& stream) {
  for (int i = 0; i < kReadsPerTurn; ++i) {
    const transport::IoResult r = stream.Read(MutableByteSpan(staging_.data(), staging_.size()));
    if (r.status == transport::IoStatus::kOk) continue;
    if (r.status == transport::IoStatus::kWouldBlock) return;
    eof_ = true;  // nothing more will come
    if (r.status == transport::IoStatus::kClosed) {
      // The peer's FIN: a Terminate or FIN of ours still queued may get
      // out, so the socket stays polled for writing (the teardown bound
      // ends the wait if the peer never reads).
      qp_.StopReading();
      return;
    }
    // Reset: nothing of ours can reach the peer any more.
    qp_.StopPolling();
    if (qp_.finalized()) {  // flushed already; only the socket is left
      qp_.EndStream(/*abort=*/true);
      return;
    }
    ErrorReport report;
    report.cause = rdmap::TerminateCause::MpaConnectionLost();
    report.event = AsyncEventType::kQpFatal;
    report.abort = true;
    if (!qp_.RaiseError(report)) qp_.EndStream(/*abort=*/true);
    return;
  }
}

QpRx::ReadOutcome QpRx::ReadPayloadDirect(transport::TcpStream& stream,
                                         const mpa::RxDemand& demand) {
  AccessStatus failure = AccessStatus::kOk;
  const std::optional<std::size_t> mapped = MapTarget(demand.payload_offset, demand.length, failure);
  if (!mapped) {
    PlacementFailed(failure);
    return ReadOutcome::kStop;
  }
  const std::size_t count = *mapped;
  // The next FPDU's framing lands in the staging buffer in the same call.
  iov_[count].iov_base = staging_.data();
  iov_[count].iov_len = TailGuess();
  const transport::IoResult r = stream.ReadV(std::span<const iovec>(iov_.data(), count + 1));
  if (r.status == transport::IoStatus::kError && r.error == EFAULT) {
    // The kernel could not write a target page: the application made
    // registered memory read-only (or unmapped it) after registering it.
    // Nothing of this read was placed; the octets stay in the socket.
    ReleaseRefs();
    PlacementFaulted();
    return ReadOutcome::kStop;
  }
  if (r.status == transport::IoStatus::kOk) {
    socket_drained_ = r.bytes < demand.length + iov_[count].iov_len;
    const std::size_t placed = std::min(r.bytes, demand.length);
    // Fold the placed octets into the CRC while the regions are still held.
    std::size_t left = placed;
    for (std::size_t i = 0; i < count && left > 0; ++i) {
      const std::size_t n = std::min(iov_[i].iov_len, left);
      parser_->CommitPayload(ByteSpan(static_cast<const std::uint8_t*>(iov_[i].iov_base), n));
      left -= n;
    }
    CounterAdd(qp_.counters().rx_direct_payload, placed);
    staged_begin_ = 0;
    staged_end_ = r.bytes - placed;
  }
  ReleaseRefs();
  return OnReadResult(r);
}

QpRx::ReadOutcome QpRx::ReadIntoStaging(transport::TcpStream& stream) {
  const transport::IoResult r = stream.Read(MutableByteSpan(staging_.data(), staging_.size()));
  if (r.status == transport::IoStatus::kOk) {
    socket_drained_ = r.bytes < staging_.size();
    staged_begin_ = 0;
    staged_end_ = r.bytes;
  }
  return OnReadResult(r);
}

QpRx::ReadOutcome QpRx::OnReadResult(const transport::IoResult& result) {
  switch (result.status) {
    case transport::IoStatus::kOk:
      CounterAdd(qp_.counters().rx_syscalls, 1);
      CounterAdd(qp_.counters().rx_octets, result.bytes);
      return ReadOutcome::kProgress;
    case transport::IoStatus::kWouldBlock:
      return ReadOutcome::kWouldBlock;
    case transport::IoStatus::kClosed:
      OnPeerClosed();
      return ReadOutcome::kStop;
    case transport::IoStatus::kError:
      OnLlpFailure(result.error);
      return ReadOutcome::kStop;
  }
  return ReadOutcome::kStop;
}

std::size_t QpRx::TailGuess() const {
  // Pad and CRC of this FPDU, then the next one's ULPDU_Length and a header
  // like this one's; markers may add one each.
  std::size_t guess = mpa::PadLength(ulpdu_length_) + mpa::kCrcSize + mpa::kUlpduLengthSize +
                      std::max(header_raw_length_, rdmap::kDdpUntaggedHeaderSize);
  if (params_.rx_markers) guess += 2 * mpa::kMarkerSize;
  // The small FPDU that ends a large message, whole: one recvmsg fewer per
  // message. When a large FPDU comes instead, that many octets of its
  // payload are copied out of the staging buffer.
  if (LargeFpdu()) guess += small_follower_octets_;
  return std::min(guess, staging_.size());
}

bool QpRx::ConsumeStaged() {
  while (Staged() > 0) {
    if (stopped_) return false;
    const mpa::RxDemand demand = parser_->Demand();
    const ByteSpan staged(staging_.data() + staged_begin_, Staged());
    switch (demand.kind) {
      case mpa::RxDemand::Kind::kFailed:
        return false;
      case mpa::RxDemand::Kind::kFraming: {
        const mpa::RxProgress progress = parser_->ConsumeFraming(staged);
        staged_begin_ += progress.consumed;
        if (!HandleEvent(progress.event)) return false;
        break;
      }
      case mpa::RxDemand::Kind::kPayload: {
        const ByteSpan source = staged.first(std::min(demand.length, staged.size()));
        if (segment_ == Segment::kTerminate) {
          // Header copies of a Terminate: at most kMaxTerminateHeaderSize in all.
          const std::size_t at = rdmap::kTerminateControlSize + demand.payload_offset;
          const std::size_t room = at < terminate_buf_.size() ? terminate_buf_.size() - at : 0;
          const std::size_t n = std::min(room, source.size());
          if (n > 0) std::memcpy(terminate_buf_.data() + at, source.data(), n);
          terminate_length_ = std::max(terminate_length_, at + n);
        } else {
          AccessStatus failure = AccessStatus::kOk;
          const std::optional<std::size_t> mapped =
              MapTarget(demand.payload_offset, source.size(), failure);
          if (!mapped) {
            PlacementFailed(failure);
            return false;
          }
          std::size_t at = 0;
          for (std::size_t i = 0; i < *mapped; ++i) {
            std::memcpy(iov_[i].iov_base, source.data() + at, iov_[i].iov_len);
            at += iov_[i].iov_len;
          }
          ReleaseRefs();
          CounterAdd(qp_.counters().rx_staged_payload, source.size());
        }
        // The CRC over the staged copy is the CRC over the placed octets.
        parser_->CommitPayload(source);
        staged_begin_ += source.size();
        break;
      }
    }
  }
  return true;
}

// ---- Events ----

bool QpRx::HandleEvent(mpa::RxEvent event) {
  switch (event) {
    case mpa::RxEvent::kNone:
      return true;
    case mpa::RxEvent::kHeaderReady:
      OnHeader(parser_->header());
      return !stopped_;
    case mpa::RxEvent::kFpduComplete:
      last_boundary_ = parser_->stream_position();
      OnFpduComplete();
      return !stopped_;
    case mpa::RxEvent::kError:
      OnMpaError(parser_->error());
      return false;
  }
  return false;
}

bool QpRx::Accepts(const RxVerdict& verdict) {
  if (verdict.accepted()) return true;
  Reject({*verdict.cause, verdict.copy_header, verdict.recv_status, verdict.read_status});
  return false;
}

void QpRx::Reject(const PendingError& error) {
  // Nothing of this segment is placed; its payload is read, CRC-checked and
  // dropped, and the error raised when the FPDU ends (a CRC error wins).
  pending_ = error;
  segment_ = Segment::kDiscard;
  if (payload_length_ > 0) parser_->DiscardPayload();
}

void QpRx::OnHeader(const mpa::FpduHeaderInfo& info) {
  segment_ = Segment::kDiscard;
  pending_.reset();
  ulpdu_length_ = info.ulpdu_length;
  payload_length_ = info.payload_length;
  header_raw_length_ = std::min(info.header.size(), header_raw_.size());
  std::memcpy(header_raw_.data(), info.header.data(), header_raw_length_);

  const rdmap::HeaderDecodeResult decoded = rdmap::DecodeDdpRdmapHeader(info.header);
  if (!Accepts(CheckDecodedHeader(decoded, info.truncated))) return;
  header_ = decoded.header;
  if (awaiting_rtr_ && header_.opcode != rdmap::Opcode::kTerminate) {
    CheckRtr(header_);
    return;
  }
  switch (header_.opcode) {
    case rdmap::Opcode::kRdmaWrite:
    case rdmap::Opcode::kRdmaReadResponse:
      HeaderTagged(header_);
      return;
    case rdmap::Opcode::kRdmaReadRequest:
      HeaderReadRequest(header_);
      return;
    case rdmap::Opcode::kTerminate:
      HeaderTerminate(header_);
      return;
    default:
      break;
  }
  if (IsSendOpcode(header_.opcode)) {
    HeaderSend(header_);
    return;
  }
  Reject({rdmap::TerminateCause::RdmapUnexpectedOpcode()});
}

bool QpRx::CheckRtr(const rdmap::DdpRdmapHeader& h) {
  if (!Accepts(engine::CheckRtr(h, payload_length_, AcceptedRtrMask(params_)))) return false;
  segment_ = Segment::kRtr;
  return true;
}

void QpRx::HeaderSend(const rdmap::DdpRdmapHeader& h) {
  if (!Accepts(CheckSendPosition(h, {send_active_, send_msn_, send_received_}))) return;
  if (!send_active_) {
    recv_wr_ = qp_.TakeReceive();
    if (recv_wr_) {
      send_active_ = true;
      send_received_ = 0;
    }
  }
  const std::optional<std::uint64_t> buffer_length =
      recv_wr_ ? std::optional<std::uint64_t>(recv_wr_->total_length()) : std::nullopt;
  if (!Accepts(CheckSendBuffer(buffer_length, h, payload_length_))) return;
  segment_ = Segment::kSend;
  if (payload_length_ > 0) {
    AccessStatus failure = AccessStatus::kOk;
    const bool ok = MapTarget(0, payload_length_, failure).has_value();
    ReleaseRefs();
    if (!ok) {
      // Our own receive buffer is bad: the peer did nothing wrong.
      segment_ = Segment::kDiscard;
      Reject({rdmap::TerminateCause::DdpLocalCatastrophic(), false, WcStatus::kLocProtErr});
      return;
    }
  }
}

void QpRx::HeaderTagged(const rdmap::DdpRdmapHeader& h) {
  MemoryTable& memory = qp_.memory();
  const PdId pd = qp_.pd();
  if (h.opcode == rdmap::Opcode::kRdmaWrite) {
    // RFC 5041 7.1 / RFC 5042 6: STag, PD (stream), rights, wrap, bounds.
    if (payload_length_ > 0 &&
        !PinCovers(h.stag, AccessKind::kRemoteWrite, h.to, payload_length_)) {
      AccessCheckResult check =
          memory.Check(h.stag, pd, AccessKind::kRemoteWrite, h.to, payload_length_);
      if (!Accepts(CheckWriteTarget(check.status))) return;
      pin_ = std::move(check.region);
    }
    tagged_stag_ = h.stag;
    tagged_to_ = h.to;
    segment_ = Segment::kWrite;
    return;
  }

  // Read Response: for the oldest outstanding Read Request.
  if (!response_active_) {
    if (const std::optional<OrqEntry> oldest = qp_.OldestRead()) {
      response_ = *oldest;
      response_active_ = true;
      response_received_ = 0;
    }
  }
  std::optional<ExpectedResponse> expected;
  if (response_active_) {
    expected = ExpectedResponse{response_.sink_stag, response_.sink_to, response_.size,
                                response_received_};
  }
  if (!Accepts(CheckReadResponse(h, payload_length_, expected))) return;
  if (payload_length_ > 0 &&
      !PinCovers(h.stag, AccessKind::kRemoteWrite, h.to, payload_length_)) {
    AccessCheckResult check =
        memory.Check(h.stag, pd, AccessKind::kRemoteWrite, h.to, payload_length_);
    if (!Accepts(CheckReadResponseTarget(check.status))) return;
    pin_ = std::move(check.region);
  }
  tagged_stag_ = h.stag;
  tagged_to_ = h.to;
  segment_ = Segment::kReadResponse;
}

void QpRx::HeaderReadRequest(const rdmap::DdpRdmapHeader& h) {
  if (!Accepts(CheckReadRequest(h, payload_length_, read_msn_))) return;
  const auto& body = std::get<rdmap::ReadRequestBody>(h.body);
  if (!CheckReadRequestBuffer(qp_.ReadRequestsOutstanding(), params_.ird).accepted()) {
    // A sendmsg that just handed a response over may not be counted yet.
    qp_.WaitForSendAccounting();
    if (!Accepts(CheckReadRequestBuffer(qp_.ReadRequestsOutstanding(), params_.ird))) return;
  }
  if (body.read_size > 0) {
    const AccessCheckResult check =
        qp_.memory().Check(body.source_stag, qp_.pd(), AccessKind::kRemoteRead,
                           body.source_to, body.read_size);
    if (!Accepts(CheckReadSource(check.status))) return;
  }
  segment_ = Segment::kReadRequest;
}

void QpRx::HeaderTerminate(const rdmap::DdpRdmapHeader& h) {
  // The Terminate Control field came with the header (the last 4 octets);
  // the header copies are the payload.
  const std::size_t control_at = header_raw_length_ - rdmap::kTerminateControlSize;
  std::memcpy(terminate_buf_.data(), header_raw_.data() + control_at, rdmap::kTerminateControlSize);
  terminate_length_ = rdmap::kTerminateControlSize;
  (void)h;
  segment_ = Segment::kTerminate;
  if (payload_length_ > terminate_buf_.size() - rdmap::kTerminateControlSize) {
    // More than any Terminate can carry: keep the control field only.
    parser_->DiscardPayload();
  }
}

// ---- Completing segments ----

void QpRx::OnFpduComplete() {
  CounterAdd(qp_.counters().rx_fpdus, 1);
  // The pin stays only across FPDUs that complete nothing (a Write, a Send
  // or Read Response before its last segment): completions and kicks may
  // run callbacks that deregister memory.
  const bool keeps_pin =
      !pending_ && (segment_ == Segment::kWrite ||
                    ((segment_ == Segment::kReadResponse || segment_ == Segment::kSend) &&
                     !header_.last));
  if (!keeps_pin) ReleasePin();
  const bool large = LargeFpdu();
  if (last_fpdu_large_ && !large) {
    const std::size_t octets = mpa::UnmarkedFpduLength(ulpdu_length_);
    small_follower_octets_ = octets <= kSmallFollowerMax ? octets : 0;
  } else if (large && header_.last) {
    small_follower_octets_ = 0;  // messages end with a large FPDU
  }
  last_fpdu_large_ = large;
  if (pending_) {
    const PendingError error = *pending_;
    pending_.reset();
    Raise(error);
    return;
  }
  switch (segment_) {
    case Segment::kSend:
      send_received_ += payload_length_;
      if (header_.last) CompleteSend();
      break;
    case Segment::kReadResponse:
      response_received_ += payload_length_;
      if (header_.last) CompleteReadResponse();
      break;
    case Segment::kReadRequest:
      CompleteReadRequest();
      break;
    case Segment::kTerminate:
      CompleteTerminate();
      break;
    case Segment::kRtr: {
      awaiting_rtr_ = false;
      if (header_.opcode == rdmap::Opcode::kSend) send_msn_ = 2;
      if (header_.opcode == rdmap::Opcode::kRdmaReadRequest) {
        CompleteReadRequest();  // answered with a zero-length Read Response
      }
      qp_.MarkRtrReceived();
      break;
    }
    case Segment::kWrite:
    case Segment::kDiscard:
    case Segment::kNone:
      break;
  }
  segment_ = Segment::kNone;
  // RFC 5044 7.1.2 rule 4: a responder sends once one FPDU has arrived and
  // been validated (with an RTR, the RTR did it above).
  if (!stopped_ && !awaiting_rtr_ && !qp_.RtrReceived()) {
    ReleasePin();
    qp_.MarkRtrReceived();
  }
}

void QpRx::CompleteSend() {
  WorkCompletion wc;
  wc.wr_id = recv_wr_->wr_id;
  wc.status = WcStatus::kSuccess;
  wc.opcode = WcOpcode::kRecv;
  wc.byte_len = static_cast<std::uint32_t>(send_received_);
  wc.qp_num = qp_.qp_num();
  const rdmap::Opcode op = header_.opcode;
  if (op == rdmap::Opcode::kSendWithInvalidate || op == rdmap::Opcode::kSendWithSeAndInvalidate) {
    // RFC 5040 5.3: invalidate the STag before the Send is delivered if it
    // is associated with this stream only, else "issue a Terminate Message
    // with the STag Cannot be Invalidated Terminate Error Code". Memory
    // regions are shared by all streams of the PD (memory.h), so a peer
    // cannot invalidate them (RFC 5040 8.1.1 rule 7).
    if (qp_.memory().InvalidateRemote(header_.invalidate_stag, qp_.pd()) !=
        InvalidateStatus::kOk) {
      Raise({rdmap::TerminateCause::RdmapStagCannotBeInvalidated(), true,
             WcStatus::kRemInvReqErr});
      return;
    }
    wc.wc_flags |= kWcWithInv;
    wc.invalidated_rkey = header_.invalidate_stag;
  }
  const bool solicited =
      op == rdmap::Opcode::kSendWithSe || op == rdmap::Opcode::kSendWithSeAndInvalidate;
  recv_wr_.reset();
  send_active_ = false;
  ++send_msn_;
  qp_.CompleteReceive(wc, solicited);
}

void QpRx::CompleteReadResponse() {
  response_active_ = false;
  // A Read completes when its last octet is placed (RFC 5040 5.5).
  qp_.CompleteOldestRead(response_);
}

void QpRx::CompleteReadRequest() {
  const auto* body = std::get_if<rdmap::ReadRequestBody>(&header_.body);
  IrqEntry entry;
  if (body != nullptr) {
    entry.sink_stag = body->sink_stag;
    entry.sink_to = body->sink_to;
    entry.source_stag = body->source_stag;
    entry.source_to = body->source_to;
    entry.size = body->read_size;
  }
  qp_.QueueReadRequest(entry);
  ++read_msn_;
  responses_owed_ = true;  // kicked after this read is processed
}

void QpRx::CompleteTerminate() {
  // Linux siw sends the control word in its own bit order (terminate.h);
  // the flag positions tell which layout arrived.
  const ByteSpan bytes(terminate_buf_.data(), terminate_length_);
  const rdmap::TerminateDecodeResult decoded = rdmap::DecodeTerminateHeader(
      bytes, rdmap::GuessTerminateLayout(bytes).value_or(rdmap::TerminateLayout::kRfc5040));
  const rdmap::TerminateHeader& t = decoded.header;
  qp_.RecordTerminateReceived(t);

  ErrorReport report;
  report.cause = t.cause;
  report.peer_terminated = true;
  report.event = AsyncEventType::kQpFatal;
  report.failed_status = StatusForPeerCause(t.cause);
  // Which of our WRs the peer's copy of our header names, if still open.
  if (const std::optional<rdmap::TerminatedDdpHeader> copy = rdmap::DecodeTerminatedDdpHeader(t)) {
    if (copy->tagged) {
      report.failed_seq = qp_.FindUnfinishedWriteByStag(copy->stag);
      if (report.failed_seq) report.failed_now = false;
    } else if (copy->qn == rdmap::kQnReadRequest) {
      report.failed_seq = qp_.FindReadByMsn(copy->msn);
    } else if (copy->qn == rdmap::kQnSend) {
      // A Send not fully sent yet: the transmit side may still be on it,
      // so its status waits for the flush.
      report.failed_seq = qp_.FindUnfinishedSendByMsn(copy->msn);
      if (report.failed_seq) report.failed_now = false;
    }
  }
  stopped_ = true;
  AbandonMessage(WcStatus::kWrFlushErr);
  qp_.RaiseError(report);
}

// ---- Errors ----

void QpRx::Raise(const PendingError& error) {
  ErrorReport report;
  report.cause = error.cause;
  report.terminate =
      error.copy_header
          ? rdmap::MakeTerminateForSegment(error.cause,
                                           ByteSpan(header_raw_.data(), header_raw_length_),
                                           ulpdu_length_)
          : rdmap::MakeTerminate(error.cause);
  report.event =
      error.local_access_event ? AsyncEventType::kQpAccessError : EventForCause(error.cause);
  if (error.read_status && response_active_ && !response_.rtr) {
    report.failed_seq = response_.seq;
    report.failed_status = *error.read_status;
  }
  stopped_ = true;
  ReleaseRefs();
  ReleasePin();
  AbandonMessage(error.recv_status.value_or(WcStatus::kWrFlushErr));
  qp_.RaiseError(report);
}

void QpRx::OnMpaError(mpa::MpaError error) {
  // RFC 5044 8: CRC or marker error; reported with an LLP-layer Terminate.
  const std::optional<rdmap::TerminateCause> cause = rdmap::TerminateCauseFromMpaError(error);
  Raise({cause.value_or(rdmap::TerminateCause::MpaLocalCatastrophic()), false});
}

void QpRx::OnPeerClosed() {
  eof_ = true;
  ReleasePin();
  // EPOLLIN/EPOLLRDHUP stay set now: stop asking for them, but keep the
  // socket for the write interest an orderly drain may still need.
  qp_.StopReading();
  if (stopped_) return;
  const bool mid_fpdu = parser_->stream_position() != last_boundary_;
  if (mid_fpdu || send_active_ || response_active_) {
    // The LLP closed inside a message (RFC 5044 8, code 1); the peer may
    // still read our Terminate.
    Raise({rdmap::TerminateCause::MpaConnectionLost(), false});
    return;
  }
  stopped_ = true;
  // An orderly close at a message boundary: send what was posted, then FIN;
  // the QP goes to ERR (qp_state.h kPeerClosing).
  qp_.OnPeerClosedInOrder();
}

void QpRx::OnLlpFailure(int error) {
  (void)error;
  eof_ = true;
  qp_.StopPolling();
  if (stopped_) return;
  stopped_ = true;
  ReleaseRefs();
  ReleasePin();
  AbandonMessage(WcStatus::kWrFlushErr);
  ErrorReport report;
  report.cause = rdmap::TerminateCause::MpaConnectionLost();
  report.event = AsyncEventType::kQpFatal;
  report.abort = true;
  qp_.RaiseError(report);
}

void QpRx::PlacementFailed(AccessStatus failure) {
  // The target passed its check at the header and failed it now: it was
  // deregistered or invalidated meanwhile. Nothing was written.
  PendingError error;
  switch (segment_) {
    case Segment::kSend:
      error = {rdmap::TerminateCause::DdpLocalCatastrophic(), false, WcStatus::kLocProtErr};
      break;
    case Segment::kReadResponse:
      error = {TaggedPlacementCause(failure), true, std::nullopt, WcStatus::kLocProtErr};
      break;
    default:
      error = {TaggedPlacementCause(failure)};
      break;
  }
  Raise(error);
}

void QpRx::PlacementFaulted() {
  // Our own memory refused the octets, which is no fault of the peer: a
  // local protection error for the WR that owns the target, and a DDP Local
  // Catastrophic Terminate with no header copy (RFC 5040 Figure 10).
  PendingError error{rdmap::TerminateCause::DdpLocalCatastrophic(), /*copy=*/false};
  if (segment_ == Segment::kSend) error.recv_status = WcStatus::kLocProtErr;
  if (segment_ == Segment::kReadResponse) error.read_status = WcStatus::kLocProtErr;
  error.local_access_event = true;  // IBV_EVENT_QP_ACCESS_ERR: local access violation
  Raise(error);
}

// ---- Targets ----

std::optional<std::size_t> QpRx::MapTarget(std::uint64_t offset, std::size_t length,
                                           AccessStatus& failure) {
  ReleaseRefs();
  MemoryTable& memory = qp_.memory();
  const PdId pd = qp_.pd();
  switch (segment_) {
    case Segment::kWrite:
    case Segment::kReadResponse: {
      const std::uint64_t to = tagged_to_ + offset;
      if (length == 0) return 0;
      if (!PinCovers(tagged_stag_, AccessKind::kRemoteWrite, to, length)) {
        AccessCheckResult check =
            memory.Check(tagged_stag_, pd, AccessKind::kRemoteWrite, to, length);
        if (!check.ok()) {
          failure = check.status;
          return std::nullopt;
        }
        pin_ = std::move(check.region);
      }
      // The pin holds the region for this read (no entry in refs_).
      iov_[0].iov_base = pin_->HostPointer(to);
      iov_[0].iov_len = length;
      return 1;
    }
    case Segment::kSend: {
      std::uint64_t message_offset = std::uint64_t{header_.mo} + offset;
      std::size_t left = length;
      std::size_t count = 0;
      std::uint64_t position = 0;
      bool pin_used = false;  // an iovec of this call points into pin_'s region
      for (const Sge& sge : recv_wr_->sges()) {
        if (left == 0) break;
        const std::uint64_t end = position + sge.length;
        if (message_offset < end && sge.length > 0) {
          const std::uint64_t inner = message_offset - position;
          const std::uint64_t to = sge.addr + inner;
          const std::size_t n =
              static_cast<std::size_t>(std::min<std::uint64_t>(sge.length - inner, left));
          if (PinCovers(sge.lkey, AccessKind::kLocalWrite, to, n)) {
            iov_[count].iov_base = pin_->HostPointer(to);
            pin_used = true;
          } else {
            AccessCheckResult check = memory.Check(sge.lkey, pd, AccessKind::kLocalWrite, to, n);
            if (!check.ok()) {
              ReleaseRefs();
              failure = check.status;
              return std::nullopt;
            }
            iov_[count].iov_base = check.region->HostPointer(to);
            // The first region checked becomes the pin, so the next FPDUs
            // of this message in the same read need no lookup; a pin an
            // earlier iovec of this call points into stays, and the others
            // are held in refs_ for this call only.
            if (!pin_used) {
              pin_ = std::move(check.region);
              pin_used = true;
            } else {
              refs_[ref_count_++] = std::move(check.region);
            }
          }
          iov_[count].iov_len = n;
          ++count;
          message_offset += n;
          left -= n;
        }
        position = end;
      }
      if (left != 0) {
        ReleaseRefs();
        failure = AccessStatus::kBaseOrBounds;
        return std::nullopt;
      }
      return count;
    }
    default:
      failure = AccessStatus::kInvalidStag;
      return std::nullopt;
  }
}

bool QpRx::PinCovers(std::uint32_t stag, AccessKind kind, std::uint64_t to,
                     std::uint64_t length) const {
  // A region that was unpublished meanwhile (Deregister waits for this pin)
  // is still the region of this STag until Deregister returns, so a Write
  // that races a deregistration lands as if it came first; invalidation is
  // seen here (RegionCovers reads the validity flag).
  return RegionCovers(pin_.get(), stag, qp_.pd(), kind, to, length);
}

void QpRx::ReleaseRefs() {
  for (std::size_t i = 0; i < ref_count_; ++i) refs_[i].Release();
  ref_count_ = 0;
}

}  // namespace siwx::engine
