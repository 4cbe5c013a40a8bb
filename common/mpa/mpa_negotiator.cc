#include "common/mpa/mpa_negotiator.h"

#include <algorithm>
#include <utility>

namespace siwx::mpa {
namespace {

std::string Us(MpaTime t) { return std::to_string(t.count()) + " us"; }

StartupFailure FailureFromFrameError(StartupFrameError e) {
  switch (e) {
    case StartupFrameError::kBadKey: return StartupFailure::kBadKey;
    case StartupFrameError::kBadRevision: return StartupFailure::kBadRevision;
    case StartupFrameError::kPrivateDataTooLong: return StartupFailure::kPrivateDataTooLong;
    case StartupFrameError::kMissingIrdOrd: return StartupFailure::kMissingIrdOrd;
    case StartupFrameError::kNone: break;
  }
  return StartupFailure::kNone;
}

// RTR preference when more than one type is possible: a zero-length Write
// needs nothing from the Responder's ULP; a Read needs an ORD/IRD slot and a
// response; a Send consumes a posted Receive.
RtrType PreferredRtr(bool write, bool read, bool send) {
  if (write) return RtrType::kWrite;
  if (read) return RtrType::kRead;
  if (send) return RtrType::kSend;
  return RtrType::kNone;
}

IrdOrdWord WordGranting(std::uint16_t ird, std::uint16_t ord, RtrType rtr) {
  IrdOrdWord w;
  w.ird = ird;
  w.ord = ord;
  w.peer_to_peer = rtr != RtrType::kNone;
  w.send_rtr = rtr == RtrType::kSend;
  w.write_rtr = rtr == RtrType::kWrite;
  w.read_rtr = rtr == RtrType::kRead;
  return w;
}

std::vector<std::uint8_t> Copy(ByteSpan s) { return {s.begin(), s.end()}; }

}  // namespace

std::string_view MpaDialectName(MpaDialect d) {
  switch (d) {
    case MpaDialect::kV1: return "MPA v1 (RFC 5044)";
    case MpaDialect::kV1Rtr: return "MPA v1 + S-bit/Rtr";
    case MpaDialect::kV2: return "MPA v2 (RFC 6581)";
  }
  return "unknown dialect";
}

std::string_view RtrTypeName(RtrType t) {
  switch (t) {
    case RtrType::kNone: return "none";
    case RtrType::kSend: return "zero-length Send";
    case RtrType::kWrite: return "zero-length RDMA Write";
    case RtrType::kRead: return "zero-length RDMA Read";
  }
  return "unknown RTR";
}

std::string_view FirstSendRuleName(FirstSendRule r) {
  switch (r) {
    case FirstSendRule::kMayNow: return "may send now";
    case FirstSendRule::kRtrFpduFirst: return "send the RTR FPDU first";
    case FirstSendRule::kAfterFirstFpdu: return "send after the first FPDU arrives";
  }
  return "unknown rule";
}

std::string_view NegotiatorStateName(NegotiatorState s) {
  switch (s) {
    case NegotiatorState::kIdle: return "idle";
    case NegotiatorState::kAwaitingReply: return "awaiting Reply";
    case NegotiatorState::kAwaitingRequest: return "awaiting Request";
    case NegotiatorState::kAwaitingConsumer: return "awaiting consumer";
    case NegotiatorState::kAwaitingRtr: return "awaiting Rtr";
    case NegotiatorState::kAwaitingFirstFpdu: return "awaiting first FPDU";
    case NegotiatorState::kFullOperation: return "full operation";
    case NegotiatorState::kRejected: return "rejected";
    case NegotiatorState::kFailed: return "failed";
  }
  return "unknown state";
}

std::string_view StartupFailureName(StartupFailure f) {
  switch (f) {
    case StartupFailure::kNone: return "none";
    case StartupFailure::kBadKey: return "bad key";
    case StartupFailure::kBadRevision: return "bad revision";
    case StartupFailure::kPrivateDataTooLong: return "private data too long";
    case StartupFailure::kMissingIrdOrd: return "missing IRD/ORD word";
    case StartupFailure::kInitiatorInitiator: return "Initiator/Initiator";
    case StartupFailure::kUnexpectedFrame: return "unexpected frame";
    case StartupFailure::kRevisionMismatch: return "revision mismatch";
    case StartupFailure::kEnhancedMismatch: return "enhanced bit mismatch";
    case StartupFailure::kRtrCrcMismatch: return "Rtr C bit mismatch";
    case StartupFailure::kCrcRefused: return "CRC refused";
    case StartupFailure::kMarkersRefused: return "markers refused";
    case StartupFailure::kInsufficientIrd: return "insufficient IRD";
    case StartupFailure::kNoMatchingRtr: return "no matching RTR";
    case StartupFailure::kTimeout: return "startup timeout";
    case StartupFailure::kFirstFpduTimeout: return "first FPDU timeout";
    case StartupFailure::kConnectionClosed: return "connection closed";
  }
  return "unknown failure";
}

std::string_view NegotiatorEventTypeName(NegotiatorEventType t) {
  switch (t) {
    case NegotiatorEventType::kRequestReceived: return "request received";
    case NegotiatorEventType::kEstablished: return "established";
    case NegotiatorEventType::kRejected: return "rejected";
    case NegotiatorEventType::kFailed: return "failed";
  }
  return "unknown event";
}

std::string_view NegotiatorStatusName(NegotiatorStatus s) {
  switch (s) {
    case NegotiatorStatus::kOk: return "ok";
    case NegotiatorStatus::kWrongState: return "wrong state";
    case NegotiatorStatus::kInvalidConfig: return "invalid configuration";
    case NegotiatorStatus::kInvalidArgument: return "invalid argument";
    case NegotiatorStatus::kPrivateDataTooLong: return "private data too long";
  }
  return "unknown status";
}

MpaNegotiator::MpaNegotiator(const NegotiatorConfig& config) : config_(config) {
  frame_.reserve(kStartupHeaderSize + kMaxPrivateDataLength);
}

std::size_t MpaNegotiator::MaxUlpPrivateData(MpaDialect dialect) const {
  return dialect == MpaDialect::kV2 ? kMaxUlpPrivateDataEnhanced : kMaxUlpPrivateDataV1;
}

NegotiatorStatus MpaNegotiator::Start(MpaTime now, ByteSpan private_data) {
  if (state_ != NegotiatorState::kIdle) return NegotiatorStatus::kWrongState;
  const bool dialect_ok = config_.dialect == MpaDialect::kV1 ||
                          config_.dialect == MpaDialect::kV1Rtr ||
                          config_.dialect == MpaDialect::kV2;
  if (!dialect_ok || config_.startup_timeout <= MpaTime::zero() ||
      config_.first_fpdu_timeout < MpaTime::zero()) {
    return NegotiatorStatus::kInvalidConfig;
  }

  if (config_.role == MpaRole::kResponder) {
    if (!private_data.empty()) return NegotiatorStatus::kInvalidArgument;
    state_ = NegotiatorState::kAwaitingRequest;
    deadline_ = now + config_.startup_timeout;
    return NegotiatorStatus::kOk;
  }

  const bool v2 = config_.dialect == MpaDialect::kV2;
  if (config_.ird > kMaxIrdOrd || config_.ord > kMaxIrdOrd) return NegotiatorStatus::kInvalidConfig;
  if (private_data.size() > MaxUlpPrivateData(config_.dialect)) {
    return NegotiatorStatus::kPrivateDataTooLong;
  }

  offered_rtr_ = {};
  std::optional<IrdOrdWord> word;
  if (v2) {
    IrdOrdWord w;
    w.ird = config_.ird;
    w.ord = config_.ord;
    if (config_.peer_to_peer) {
      // A Read RTR would need an ORD slot we did not ask for.
      offered_rtr_.send = config_.rtr_types.send;
      offered_rtr_.write = config_.rtr_types.write;
      offered_rtr_.read = config_.rtr_types.read && config_.ord >= 1;
      if (!offered_rtr_.send && !offered_rtr_.write && !offered_rtr_.read) {
        return NegotiatorStatus::kInvalidConfig;
      }
      w.peer_to_peer = true;
      w.send_rtr = offered_rtr_.send;
      w.write_rtr = offered_rtr_.write;
      w.read_rtr = offered_rtr_.read;
    }
    word = w;
  }

  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kRequest;
  spec.markers = config_.markers_wanted;
  spec.crc = config_.crc == CrcPolicy::kRequire;
  spec.revision = v2 ? kMpaRevision2 : kMpaRevision1;
  // The S bit says "I will send an Rtr frame"; the v2 bit says "IRD/ORD
  // word follows". The revision tells the peer which one we mean.
  spec.x_bit = config_.dialect != MpaDialect::kV1;
  spec.ird_ord = word;
  spec.ulp_private_data = private_data;
  Send(spec);

  sent_revision_ = spec.revision;
  sent_crc_ = spec.crc;
  sent_s_bit_ = config_.dialect == MpaDialect::kV1Rtr;
  params_.local_private_data = Copy(private_data);
  state_ = NegotiatorState::kAwaitingReply;
  deadline_ = now + config_.startup_timeout;
  return NegotiatorStatus::kOk;
}

bool MpaNegotiator::ExpectingFrame() const {
  return state_ == NegotiatorState::kAwaitingReply || state_ == NegotiatorState::kAwaitingRequest ||
         state_ == NegotiatorState::kAwaitingRtr;
}

std::size_t MpaNegotiator::Feed(MpaTime now, ByteSpan bytes) {
  OnTime(now);  // octets that arrive after the deadline are too late
  if (!ExpectingFrame()) return 0;

  std::size_t consumed = 0;
  for (;;) {
    const StartupDecodeResult r = DecodeStartupFrame(frame_);
    if (r.status == StartupDecodeStatus::kMalformed) {
      Fail(MpaError::kInvalidStartupFrame, FailureFromFrameError(r.error),
           std::string("malformed startup frame: ") + std::string(StartupFrameErrorName(r.error)));
      return consumed;
    }
    if (r.status == StartupDecodeStatus::kComplete) {
      HandleFrame(r.frame);
      frame_.clear();
      // Whatever follows is the next phase's: never read past one frame.
      return consumed;
    }
    if (consumed == bytes.size()) return consumed;
    // `needed` never reaches past the frame: below 20 octets it counts only
    // to the end of the header, which every frame has.
    const std::size_t take = std::min(r.needed, bytes.size() - consumed);
    frame_.insert(frame_.end(), bytes.begin() + static_cast<std::ptrdiff_t>(consumed),
                  bytes.begin() + static_cast<std::ptrdiff_t>(consumed + take));
    consumed += take;
  }
}

void MpaNegotiator::OnTime(MpaTime now) {
  if (!deadline_ || now < *deadline_) return;
  switch (state_) {
    case NegotiatorState::kAwaitingReply:
      Fail(MpaError::kConnectionLost, StartupFailure::kTimeout,
           "no MPA Reply within " + Us(config_.startup_timeout) + " (RFC 5044 7.1.2 rule 10)");
      break;
    case NegotiatorState::kAwaitingRequest:
      Fail(MpaError::kConnectionLost, StartupFailure::kTimeout,
           "no MPA Request within " + Us(config_.startup_timeout) +
               "; Responder/Responder startup? (RFC 5044 7.1.2 rule 8)");
      break;
    case NegotiatorState::kAwaitingRtr:
      Fail(MpaError::kConnectionLost, StartupFailure::kTimeout,
           "no Rtr frame within " + Us(config_.startup_timeout) + " after the accepting Reply");
      break;
    case NegotiatorState::kAwaitingFirstFpdu:
      Fail(MpaError::kConnectionLost, StartupFailure::kFirstFpduTimeout,
           "no first FPDU within " + Us(config_.first_fpdu_timeout) +
               " after the accepting Reply (RFC 5044 7.1.2 rule 10)");
      break;
    default: deadline_.reset(); break;
  }
}

void MpaNegotiator::HandleFrame(const StartupFrameView& frame) {
  switch (state_) {
    case NegotiatorState::kAwaitingRequest: HandleRequest(frame); break;
    case NegotiatorState::kAwaitingReply: HandleReply(frame); break;
    case NegotiatorState::kAwaitingRtr: HandleRtr(frame); break;
    default: break;
  }
}

void MpaNegotiator::HandleRequest(const StartupFrameView& frame) {
  const StartupHeader& h = frame.header;
  if (h.kind != StartupFrameKind::kRequest) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame,
         "received an " + std::string(StartupFrameKindName(h.kind)) +
             " frame while waiting for the MPA Request");
    return;
  }
  deadline_.reset();

  offer_ = {};
  offer_.revision = h.revision;
  offer_.markers = h.markers;
  offer_.crc = h.crc;
  offer_.reserved_bits = h.reserved;
  offer_.ird_ord = frame.ird_ord;
  offer_.private_data = Copy(frame.ulp_private_data);
  offer_.dialect = IsEnhanced(h)        ? MpaDialect::kV2
                   : HasRtrIndicator(h) ? MpaDialect::kV1Rtr
                                        : MpaDialect::kV1;

  // Answer in the offered dialect if we have it, else fall back to plain v1
  // (an S bit is only answered when it was offered, the enhanced data only
  // when it was sent).
  if (offer_.dialect == MpaDialect::kV2) {
    offer_.answer_dialect = config_.dialect >= MpaDialect::kV2 ? MpaDialect::kV2 : MpaDialect::kV1;
  } else if (offer_.dialect == MpaDialect::kV1Rtr) {
    offer_.answer_dialect =
        config_.dialect >= MpaDialect::kV1Rtr ? MpaDialect::kV1Rtr : MpaDialect::kV1;
  } else {
    offer_.answer_dialect = MpaDialect::kV1;
  }
  // A Rev 2 Request without the enhanced bit is v1 semantics under Rev 2;
  // a v2 Responder keeps the revision, an older one answers Rev 1.
  answer_revision_ = (h.revision == kMpaRevision2 && config_.dialect >= MpaDialect::kV2)
                         ? kMpaRevision2
                         : kMpaRevision1;

  params_ = {};
  params_.peer_private_data = offer_.private_data;

  if (h.markers && !config_.markers_can_send) {
    RejectLocally(StartupFailure::kMarkersRefused,
                  "peer requires markers (M = 1) and this end does not send them");
    return;
  }
  if (h.crc && config_.crc == CrcPolicy::kRefuse) {
    RejectLocally(StartupFailure::kCrcRefused,
                  "peer requires CRC (C = 1) and local policy refuses CRC");
    return;
  }
  if (offer_.answer_dialect == MpaDialect::kV2 && offer_.ird_ord->peer_to_peer) {
    const IrdOrdWord& w = *offer_.ird_ord;
    // A Read RTR takes one of the Initiator's ORD slots.
    offer_.rtr = PreferredRtr(w.write_rtr && config_.rtr_types.write,
                              w.read_rtr && config_.rtr_types.read && w.ord >= 1,
                              w.send_rtr && config_.rtr_types.send);
    if (offer_.rtr == RtrType::kNone) {
      RejectLocally(StartupFailure::kNoMatchingRtr,
                    "peer-to-peer requested but no offered RTR type is acceptable here");
      return;
    }
  }

  state_ = NegotiatorState::kAwaitingConsumer;
  Emit({NegotiatorEventType::kRequestReceived, MpaError::kNone, StartupFailure::kNone, false, {}});
}

void MpaNegotiator::RejectLocally(StartupFailure failure, std::string reason) {
  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kReply;
  spec.reject = true;
  spec.revision = answer_revision_;
  if (offer_.answer_dialect == MpaDialect::kV2) {
    spec.x_bit = true;
    spec.ird_ord = IrdOrdWord{};  // no resources granted
  }
  Send(spec);
  deadline_.reset();
  state_ = NegotiatorState::kRejected;
  Emit({NegotiatorEventType::kRejected, MpaError::kNone, failure, false, std::move(reason)});
}

NegotiatorStatus MpaNegotiator::Accept(MpaTime now, ByteSpan private_data, std::uint16_t ird,
                                       std::uint16_t ord) {
  if (state_ != NegotiatorState::kAwaitingConsumer) return NegotiatorStatus::kWrongState;
  if (ird > kMaxIrdOrd || ord > kMaxIrdOrd) return NegotiatorStatus::kInvalidArgument;
  const MpaDialect answer = offer_.answer_dialect;
  if (private_data.size() > MaxUlpPrivateData(answer)) return NegotiatorStatus::kPrivateDataTooLong;

  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kReply;
  spec.markers = config_.markers_wanted;
  // RFC 5044 7.1.1: C = 1 in either frame turns CRC on; echo it so the
  // Reply states the outcome.
  spec.crc = offer_.crc || config_.crc == CrcPolicy::kRequire;
  spec.revision = answer_revision_;
  spec.x_bit = answer == MpaDialect::kV2 || answer == MpaDialect::kV1Rtr;
  spec.ulp_private_data = private_data;

  params_.ird = ird;
  params_.ord = ord;
  if (answer == MpaDialect::kV2) {
    // Never promise more than the peer can use: our IRD need not exceed its
    // ORD, and our ORD must not exceed its IRD.
    const std::uint16_t reply_ird = std::min(ird, offer_.ird_ord->ord);
    const std::uint16_t reply_ord = std::min(ord, offer_.ird_ord->ird);
    if (offer_.rtr == RtrType::kRead && reply_ird == 0) return NegotiatorStatus::kInvalidArgument;
    spec.ird_ord = WordGranting(reply_ird, reply_ord, offer_.rtr);
    params_.ird_ord_exchanged = true;
    params_.ird = reply_ird;
    params_.ord = reply_ord;
    params_.peer_to_peer = offer_.rtr != RtrType::kNone;
    params_.rtr = offer_.rtr;
  }
  Send(spec);

  params_.dialect = answer;
  params_.revision = answer_revision_;
  params_.crc = spec.crc;
  params_.markers_tx = offer_.markers;
  params_.markers_rx = config_.markers_wanted;
  params_.local_private_data = Copy(private_data);

  if (answer == MpaDialect::kV1Rtr) {
    // Proposal: the Responder may send once the Rtr frame has arrived.
    params_.first_send = FirstSendRule::kMayNow;
    state_ = NegotiatorState::kAwaitingRtr;
    deadline_ = now + config_.startup_timeout;
    return NegotiatorStatus::kOk;
  }
  // RFC 5044 7.1.2 rule 4; with an RFC 6581 RTR, that first FPDU is the RTR.
  params_.first_send = FirstSendRule::kAfterFirstFpdu;
  state_ = NegotiatorState::kAwaitingFirstFpdu;
  if (config_.first_fpdu_timeout > MpaTime::zero()) {
    deadline_ = now + config_.first_fpdu_timeout;
  } else {
    deadline_.reset();
  }
  Emit({NegotiatorEventType::kEstablished, MpaError::kNone, StartupFailure::kNone, false, {}});
  return NegotiatorStatus::kOk;
}

NegotiatorStatus MpaNegotiator::Reject(ByteSpan private_data) {
  if (state_ != NegotiatorState::kAwaitingConsumer) return NegotiatorStatus::kWrongState;
  if (private_data.size() > MaxUlpPrivateData(offer_.answer_dialect)) {
    return NegotiatorStatus::kPrivateDataTooLong;
  }
  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kReply;
  spec.reject = true;
  spec.revision = answer_revision_;
  if (offer_.answer_dialect == MpaDialect::kV2) {
    spec.x_bit = true;
    spec.ird_ord = IrdOrdWord{};
  }
  spec.ulp_private_data = private_data;
  Send(spec);
  params_.local_private_data = Copy(private_data);
  state_ = NegotiatorState::kRejected;  // rule 2: exit MPA, TCP stays open
  return NegotiatorStatus::kOk;
}

void MpaNegotiator::HandleReply(const StartupFrameView& frame) {
  const StartupHeader& h = frame.header;
  if (h.kind == StartupFrameKind::kRequest) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kInitiatorInitiator,
         "received an MPA Request while waiting for the Reply: both ends started as "
         "Initiator (RFC 5044 7.1.2 rule 8)");
    return;
  }
  if (h.kind != StartupFrameKind::kReply) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame,
         "received an " + std::string(StartupFrameKindName(h.kind)) +
             " frame while waiting for the MPA Reply");
    return;
  }
  deadline_.reset();
  if (h.revision > sent_revision_) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kRevisionMismatch,
         "Reply revision " + std::to_string(h.revision) + " is above the Request's " +
             std::to_string(sent_revision_));
    return;
  }
  // Our only Rev 2 Request is an enhanced one. A Rev 1 Reply to it is a
  // fallback; a Rev 2 Reply must keep the enhanced bit.
  if (h.revision == kMpaRevision2 && !h.x_bit) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedMismatch,
         "Rev 2 Reply without the enhanced bit answers an enhanced Request (RFC 6581)");
    return;
  }
  params_.revision = h.revision;
  params_.peer_private_data = Copy(frame.ulp_private_data);

  if (h.reject) {
    state_ = NegotiatorState::kRejected;  // rule 3: exit MPA, TCP stays open
    Emit({NegotiatorEventType::kRejected, MpaError::kNone, StartupFailure::kNone, true,
          "peer rejected the connection (R = 1)"});
    return;
  }
  if (h.markers && !config_.markers_can_send) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kMarkersRefused,
         "peer requires markers (M = 1) and this end does not send them");
    return;
  }
  const bool crc = sent_crc_ || h.crc;
  if (crc && config_.crc == CrcPolicy::kRefuse) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kCrcRefused,
         "peer requires CRC (C = 1) and local policy refuses CRC");
    return;
  }

  params_.crc = crc;
  params_.markers_tx = h.markers;
  params_.markers_rx = config_.markers_wanted;
  params_.ird = config_.ird;
  params_.ord = config_.ord;
  params_.first_send = FirstSendRule::kMayNow;

  if (IsEnhanced(h)) {
    params_.dialect = MpaDialect::kV2;
    const IrdOrdWord& w = *frame.ird_ord;
    if (w.ord > config_.ird) {
      Fail(MpaError::kInvalidStartupFrame, StartupFailure::kInsufficientIrd,
           "Responder ORD " + std::to_string(w.ord) + " exceeds our IRD " +
               std::to_string(config_.ird) + " (RFC 6581)");
      return;
    }
    params_.ird_ord_exchanged = true;
    params_.ird = w.ord;
    params_.ord = std::min(config_.ord, w.ird);
    if (config_.peer_to_peer) {
      const RtrType rtr = w.peer_to_peer
                              ? PreferredRtr(w.write_rtr && offered_rtr_.write,
                                             w.read_rtr && offered_rtr_.read && params_.ord >= 1,
                                             w.send_rtr && offered_rtr_.send)
                              : RtrType::kNone;
      if (rtr == RtrType::kNone) {
        Fail(MpaError::kInvalidStartupFrame, StartupFailure::kNoMatchingRtr,
             "Reply grants no RTR type this end offered (RFC 6581)");
        return;
      }
      params_.peer_to_peer = true;
      params_.rtr = rtr;
      params_.first_send = FirstSendRule::kRtrFpduFirst;
    }
    // Without our peer-to-peer request, any A/B/C/D bits are ignored: the
    // Responder still waits for our first FPDU.
  } else if (sent_s_bit_ && HasRtrIndicator(h)) {
    params_.dialect = MpaDialect::kV1Rtr;
    // Proposal: the Rtr frame follows the accepting Reply and carries the
    // Reply's C bit.
    StartupFrameSpec rtr;
    rtr.kind = StartupFrameKind::kRtr;
    rtr.markers = config_.markers_wanted;
    rtr.crc = h.crc;
    rtr.revision = kMpaRevision1;
    Send(rtr);
  } else {
    // Plain v1, also the fallback for v2 and S-bit offers. An S bit we did
    // not offer is a reserved bit to us (not checked, RFC 5044 7.1.1).
    params_.dialect = MpaDialect::kV1;
  }
  state_ = NegotiatorState::kFullOperation;
  Emit({NegotiatorEventType::kEstablished, MpaError::kNone, StartupFailure::kNone, false, {}});
}

void MpaNegotiator::HandleRtr(const StartupFrameView& frame) {
  const StartupHeader& h = frame.header;
  if (h.kind != StartupFrameKind::kRtr) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kUnexpectedFrame,
         "received an " + std::string(StartupFrameKindName(h.kind)) +
             " frame while waiting for the Rtr frame");
    return;
  }
  if (h.crc != params_.crc) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kRtrCrcMismatch,
         std::string("Rtr frame has C = ") + (h.crc ? "1" : "0") +
             " but the Reply had C = " + (params_.crc ? "1" : "0"));
    return;
  }
  // M, Res and any private data of the Rtr frame carry nothing defined.
  deadline_.reset();
  state_ = NegotiatorState::kFullOperation;
  Emit({NegotiatorEventType::kEstablished, MpaError::kNone, StartupFailure::kNone, false, {}});
}

void MpaNegotiator::NoteFirstFpduReceived() {
  if (state_ != NegotiatorState::kAwaitingFirstFpdu) return;
  deadline_.reset();
  state_ = NegotiatorState::kFullOperation;
}

void MpaNegotiator::OnConnectionClosed() {
  switch (state_) {
    case NegotiatorState::kIdle:
    case NegotiatorState::kAwaitingReply:
    case NegotiatorState::kAwaitingRequest:
    case NegotiatorState::kAwaitingConsumer:
    case NegotiatorState::kAwaitingRtr:
      Fail(MpaError::kConnectionLost, StartupFailure::kConnectionClosed,
           "TCP connection closed during MPA startup (" + std::string(NegotiatorStateName(state_)) +
               ")");
      break;
    default: break;  // established: the FPDU layer reports it; terminal: already over
  }
}

void MpaNegotiator::Fail(MpaError error, StartupFailure failure, std::string reason) {
  deadline_.reset();
  frame_.clear();
  state_ = NegotiatorState::kFailed;
  Emit({NegotiatorEventType::kFailed, error, failure, false, std::move(reason)});
}

void MpaNegotiator::Emit(NegotiatorEvent event) { events_.push_back(std::move(event)); }

void MpaNegotiator::Send(const StartupFrameSpec& spec) {
  // Every spec built here is valid by construction; a failure would be a
  // bug in this file, and then sending nothing is the safe outcome.
  (void)EncodeStartupFrame(spec, &output_);
}

ByteSpan MpaNegotiator::PendingOutput() const { return ByteSpan(output_).subspan(output_sent_); }

void MpaNegotiator::ConsumeOutput(std::size_t n) {
  output_sent_ += std::min(n, output_.size() - output_sent_);
  if (output_sent_ == output_.size()) {
    output_.clear();
    output_sent_ = 0;
  }
}

std::optional<NegotiatorEvent> MpaNegotiator::NextEvent() {
  if (events_.empty()) return std::nullopt;
  NegotiatorEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

}  // namespace siwx::mpa
