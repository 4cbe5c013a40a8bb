// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
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

// The Initiator's pick when the Reply leaves it more than one RTR type (the
// choice is its own, RFC 6581 1.1): a zero-length Write needs nothing from
// the Responder's ULP; a Read needs an ORD/IRD slot and a response; a Send
// consumes a posted Receive.
RtrType PreferredRtr(bool write, bool read, bool send) {
  if (write) return RtrType::kWrite;
  if (read) return RtrType::kRead;
  if (send) return RtrType::kSend;
  return RtrType::kNone;
}

IrdOrdWord MakeWord(std::uint16_t ird, std::uint16_t ord, bool peer_to_peer,
                    const RtrTypeSet& rtr) {
  IrdOrdWord w;
  w.ird = ird;
  w.ord = ord;
  w.peer_to_peer = peer_to_peer;
  // RFC 6581 9.2: with A = 0, B, C and D MUST be 0.
  w.send_rtr = peer_to_peer && rtr.send;
  w.write_rtr = peer_to_peer && rtr.write;
  w.read_rtr = peer_to_peer && rtr.read;
  return w;
}

constexpr RtrTypeSet kNoRtrTypes{false, false, false};

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
    case StartupFailure::kEnhancedUnsupported: return "enhanced establishment not supported";
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
    // RFC 6581 9.2: a responder supporting enhanced establishment MUST
    // support at least one RTR type.
    if (config_.dialect == MpaDialect::kV2 && !config_.rtr_types.Any()) {
      return NegotiatorStatus::kInvalidConfig;
    }
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
      // RFC 6581 9.2: A = 1 and every RTR type we can send. A Read RTR would
      // need an ORD slot we did not ask for.
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
  // In Rev 1 the S bit says "I will send an Rtr frame"; in Rev 2 it says
  // "the IRD/ORD word follows" (RFC 6581 6). We only send Rev 2 with S.
  spec.x_bit = config_.dialect != MpaDialect::kV1;
  spec.large_fpdus = config_.large_fpdus;
  spec.ird_ord = word;
  spec.ulp_private_data = private_data;
  Send(spec);

  sent_revision_ = spec.revision;
  sent_crc_ = spec.crc;
  sent_s_bit_ = config_.dialect == MpaDialect::kV1Rtr;
  sent_large_fpdus_ = spec.large_fpdus;
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
  offer_.large_fpdus = h.large_fpdus;
  offer_.reserved_bits = h.reserved;
  offer_.ird_ord = frame.ird_ord;
  offer_.private_data = Copy(frame.ulp_private_data);
  offer_.dialect = IsEnhanced(h)        ? MpaDialect::kV2
                   : HasRtrIndicator(h) ? MpaDialect::kV1Rtr
                                        : MpaDialect::kV1;

  params_ = {};
  params_.peer_private_data = offer_.private_data;
  params_.peer_ird_ord = offer_.ird_ord;

  if (offer_.dialect == MpaDialect::kV2 && config_.dialect < MpaDialect::kV2) {
    // RFC 6581 10: a responder without enhanced establishment "MUST close
    // the TCP connection and exit MPA"; answering Rev 1 is not an option.
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedUnsupported,
         "enhanced (Rev 2, S = 1) Request and this end is configured for " +
             std::string(MpaDialectName(config_.dialect)) + " (RFC 6581 10)");
    return;
  }
  // Answer in the offered dialect if we have it (an enhanced Request always
  // gets an enhanced Reply here, RFC 6581 10); an S-bit offer to a v1
  // Responder is answered with S clear.
  if (offer_.dialect == MpaDialect::kV2) {
    offer_.answer_dialect = MpaDialect::kV2;
  } else if (offer_.dialect == MpaDialect::kV1Rtr) {
    offer_.answer_dialect =
        config_.dialect >= MpaDialect::kV1Rtr ? MpaDialect::kV1Rtr : MpaDialect::kV1;
  } else {
    offer_.answer_dialect = MpaDialect::kV1;
  }
  // A Rev 2 Request without S is unenhanced (RFC 6581 6) and gets an
  // unenhanced Reply (10); a v2 Responder keeps the revision, an older one
  // answers Rev 1.
  answer_revision_ = (h.revision == kMpaRevision2 && config_.dialect >= MpaDialect::kV2)
                         ? kMpaRevision2
                         : kMpaRevision1;

  if (offer_.answer_dialect == MpaDialect::kV2 && offer_.ird_ord->peer_to_peer) {
    // RFC 6581 9.2: the Reply MUST echo A = 1, SHOULD flag every offered
    // RTR type we support, and MUST flag at least one type we support even
    // when none of ours was offered; the Initiator then picks or sends a
    // Terminate. So there is no reject for want of a common RTR type.
    const IrdOrdWord& w = *offer_.ird_ord;
    const RtrTypeSet common{w.send_rtr && config_.rtr_types.send,
                            w.write_rtr && config_.rtr_types.write,
                            w.read_rtr && config_.rtr_types.read};
    offer_.peer_to_peer = true;
    offer_.rtr_types = common.Any() ? common : config_.rtr_types;
  }

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
  state_ = NegotiatorState::kAwaitingConsumer;
  Emit({NegotiatorEventType::kRequestReceived, MpaError::kNone, StartupFailure::kNone, false, {}});
}

void MpaNegotiator::SendReject(ByteSpan private_data, std::uint16_t ird, std::uint16_t ord) {
  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kReply;
  spec.reject = true;
  spec.revision = answer_revision_;
  if (offer_.answer_dialect == MpaDialect::kV2) {
    // An enhanced Request gets an enhanced Reply, rejecting or not (RFC 6581
    // 10), with A echoed (9.2).
    spec.x_bit = true;
    spec.ird_ord = MakeWord(ird, ord, offer_.peer_to_peer, offer_.rtr_types);
  }
  spec.ulp_private_data = private_data;
  Send(spec);
}

void MpaNegotiator::RejectLocally(StartupFailure failure, std::string reason) {
  SendReject({}, 0, 0);  // no resources offered
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
  // L answers L: set only when the Request had it and we take the offer.
  spec.large_fpdus = offer_.large_fpdus && config_.large_fpdus;
  spec.ulp_private_data = private_data;

  std::uint16_t local_ird = ird;
  std::uint16_t local_ord = ord;
  RtrTypeSet rtr = kNoRtrTypes;
  if (answer == MpaDialect::kV2) {
    const IrdOrdWord& peer = *offer_.ird_ord;
    // RFC 6581 9.1: 0x3FFF from the Initiator means "the ULP negotiates":
    // keep the local value and echo 0x3FFF.
    const bool ird_by_ulp = peer.ord == kIrdOrdNotNegotiated;
    const bool ord_by_ulp = peer.ird == kIrdOrdNotNegotiated;
    // Never promise more than the peer can use: our IRD need not exceed its
    // ORD, and our ORD MUST NOT exceed its IRD (9.1).
    std::uint16_t reply_ird = ird_by_ulp ? kIrdOrdNotNegotiated : std::min(ird, peer.ord);
    const std::uint16_t reply_ord = ord_by_ulp ? kIrdOrdNotNegotiated : std::min(ord, peer.ird);
    if (offer_.peer_to_peer) {
      rtr = offer_.rtr_types;
      if (ird == 0) rtr.read = false;  // a Read RTR needs an inbound Read slot here
      if (!rtr.Any()) return NegotiatorStatus::kInvalidArgument;
      // 9.1: the Responder IRD may be raised (to 1) to carry a Read RTR.
      if (rtr.read && !ird_by_ulp && reply_ird == 0) reply_ird = 1;
    }
    spec.ird_ord = MakeWord(reply_ird, reply_ord, offer_.peer_to_peer, rtr);
    if (!ird_by_ulp) local_ird = reply_ird;
    if (!ord_by_ulp) local_ord = reply_ord;
  }
  Send(spec);

  params_.ird = local_ird;
  params_.ord = local_ord;
  if (answer == MpaDialect::kV2) {
    params_.ird_ord_exchanged = true;
    params_.peer_to_peer = offer_.peer_to_peer;
    params_.rtr_types = rtr;
    params_.rtr = RtrType::kNone;  // the Initiator chooses (RFC 6581 1.1)
  }

  params_.dialect = answer;
  params_.revision = answer_revision_;
  params_.crc = spec.crc;
  params_.markers_tx = offer_.markers;
  params_.markers_rx = config_.markers_wanted;
  params_.large_fpdus = spec.large_fpdus;
  params_.local_private_data = Copy(private_data);

  if (answer == MpaDialect::kV1Rtr) {
    // Proposal: the Responder may send once the Rtr frame has arrived.
    params_.first_send = FirstSendRule::kMayNow;
    state_ = NegotiatorState::kAwaitingRtr;
    deadline_ = now + config_.startup_timeout;
    return NegotiatorStatus::kOk;
  }
  // RFC 5044 7.1.2 rule 4; with an RFC 6581 RTR, that first FPDU is the RTR
  // ("MPA Fencing", RFC 6581 3, 4.3).
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

NegotiatorStatus MpaNegotiator::Reject(ByteSpan private_data, std::uint16_t ird,
                                       std::uint16_t ord) {
  if (state_ != NegotiatorState::kAwaitingConsumer) return NegotiatorStatus::kWrongState;
  if (ird > kMaxIrdOrd || ord > kMaxIrdOrd) return NegotiatorStatus::kInvalidArgument;
  if (private_data.size() > MaxUlpPrivateData(offer_.answer_dialect)) {
    return NegotiatorStatus::kPrivateDataTooLong;
  }
  SendReject(private_data, ird, ord);
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
  // Our only Rev 2 Request is an enhanced one. RFC 6581 10: an enhanced
  // Responder MUST answer it with an enhanced Reply, and one without
  // enhanced support MUST close the connection instead of replying. So an
  // unenhanced Reply, accepting or rejecting, is a protocol error, not a
  // fallback; the ULP may retry with a v1 Request on a new connection.
  if (sent_revision_ == kMpaRevision2 && !IsEnhanced(h)) {
    Fail(MpaError::kInvalidStartupFrame, StartupFailure::kEnhancedMismatch,
         "Rev " + std::to_string(h.revision) + " Reply with S = " + (h.x_bit ? "1" : "0") +
             " answers an enhanced Request (RFC 6581 10); retry with an MPA v1 Request");
    return;
  }
  params_.revision = h.revision;
  params_.peer_private_data = Copy(frame.ulp_private_data);
  // RFC 6581 9.1: the ULP sees the Responder's IRD/ORD for accepting and
  // rejecting Replies alike.
  params_.peer_ird_ord = frame.ird_ord;

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
  // Our Request offered L and the accepting Reply answers it.
  params_.large_fpdus = sent_large_fpdus_ && h.large_fpdus;
  params_.ird = config_.ird;
  params_.ord = config_.ord;
  params_.first_send = FirstSendRule::kMayNow;

  if (IsEnhanced(h)) {
    params_.dialect = MpaDialect::kV2;
    params_.ird_ord_exchanged = true;
    const IrdOrdWord& w = *frame.ird_ord;
    // RFC 6581 9.1: IRD at least the Responder ORD, ORD at most the
    // Responder IRD; 0x3FFF from the Responder leaves the local value alone.
    // A Responder ORD above the IRD we offered cannot be met: Terminate
    // with code 6. The Reply has set the framing (M, C), so the Terminate
    // can go out as an FPDU.
    if (w.ord != kIrdOrdNotNegotiated) {
      if (w.ord > config_.ird) {
        Fail(MpaError::kInsufficientIrd, StartupFailure::kInsufficientIrd,
             "Responder ORD " + std::to_string(w.ord) + " exceeds our IRD " +
                 std::to_string(config_.ird) + " (RFC 6581 9.1)",
             true);
        return;
      }
      params_.ird = w.ord;
    }
    if (w.ird != kIrdOrdNotNegotiated) params_.ord = std::min(config_.ord, w.ird);
    if (config_.peer_to_peer) {
      // RFC 6581 9.2: the Responder MUST echo A = 1; with A = 0 or no RTR
      // type we can send, Terminate with code 7 ("no mutually compatible
      // connection model or RTR option").
      if (!w.peer_to_peer) {
        Fail(MpaError::kNoMatchingRtr, StartupFailure::kNoMatchingRtr,
             "peer-to-peer requested and the Reply has A = 0 (RFC 6581 9.2)", true);
        return;
      }
      const RtrType rtr = PreferredRtr(w.write_rtr && offered_rtr_.write,
                                       w.read_rtr && offered_rtr_.read && params_.ord >= 1,
                                       w.send_rtr && offered_rtr_.send);
      if (rtr == RtrType::kNone) {
        Fail(MpaError::kNoMatchingRtr, StartupFailure::kNoMatchingRtr,
             "the Reply advertises no RTR type this end can send (RFC 6581 9.2)", true);
        return;
      }
      params_.peer_to_peer = true;
      params_.rtr_types = RtrTypeSet{w.send_rtr, w.write_rtr, w.read_rtr};
      params_.rtr = rtr;
      params_.first_send = FirstSendRule::kRtrFpduFirst;
    }
    // A = 1 in a Reply to our A = 0 breaks 9.2 ("MUST set Control Flag A to
    // 0"); no RTR type was negotiated, so we ignore it and our first FPDU is
    // the plain RFC 5044 7.1.2 rule 4 one.
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
    // Plain v1, also the fallback for an S-bit offer (the proposal's S = 0
    // Reply). An S bit we did not offer is a reserved bit to us (not
    // checked, RFC 5044 7.1.1).
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

void MpaNegotiator::Fail(MpaError error, StartupFailure failure, std::string reason,
                         bool send_terminate) {
  deadline_.reset();
  frame_.clear();
  state_ = NegotiatorState::kFailed;
  Emit({NegotiatorEventType::kFailed, error, failure, false, std::move(reason), send_terminate});
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
