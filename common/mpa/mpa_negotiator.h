// Sans-IO MPA startup negotiation (RFC 5044 section 7.1, the Rtr/S-bit
// peer-to-peer proposal, RFC 6581): bytes and time in, bytes and events out.
//
// One MpaNegotiator runs the Startup Phase of one TCP connection, as the
// Initiator (sends the MPA Request) or the Responder (waits for it). It owns
// no socket and reads no clock: the transport feeds received octets with
// Feed(), sends what PendingOutput() holds, calls OnTime() when Deadline()
// passes, and reacts to events from NextEvent().
//
//   Initiator: Start(pd) -> Request out -> Reply in -> kEstablished (Rtr frame
//              out first in the S-bit dialect) | kRejected | kFailed.
//   Responder: Start() -> Request in -> kRequestReceived -> consumer calls
//              Accept(pd, ird, ord) or Reject(pd) -> Reply out ->
//              kEstablished (after the Rtr frame in the S-bit dialect).
//
// Dialects and fallback. The Initiator offers exactly its configured
// dialect. The Responder answers in the highest dialect both support and
// never above what was offered: a v2 offer meets a v1 or v1+Rtr Responder
// -> Rev 1 plain Reply; an S-bit offer meets a v1 Responder -> S clear; an
// older offer is answered in kind. The Initiator accepts those older Replies
// (fallback) but not a Reply newer than its Request.
//
// Octet ownership: Feed() consumes only startup-frame octets. Octets after a
// frame in the same call are left unconsumed: they belong to the FPDU stream
// (or, after a reject, to whatever the ULP does with the TCP connection).
// Feed() also consumes nothing while no frame is expected (before Start(),
// while the consumer decides, after establishment or a terminal event).
//
// Errors. Malformed or unexpected frames, policy conflicts and startup
// timeouts end the negotiation with a kFailed event carrying the RFC 5044
// section 8 code (kInvalidStartupFrame = 4, or kConnectionLost = 1 for a
// timeout or close), a StartupFailure detail and a readable reason; the
// transport then closes the TCP connection. A reject (R = 1, sent or
// received) exits MPA with the TCP connection left open (rule 2/3).
// Consumer mistakes (private data over the limit, a call in the wrong state)
// return a NegotiatorStatus and change nothing.
//
// What it does not do: build or parse FPDUs (the RTR FPDU of RFC 6581 is
// the engine's; the negotiator only says which one), decide whether private
// data is acceptable (the consumer does), or enforce per-FPDU rules.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/bytes.h"
#include "common/wire/mpa_constants.h"
#include "common/wire/mpa_startup.h"

namespace siwx::mpa {

// Time since an epoch of the caller's choosing (a steady clock, a test's 0).
using MpaTime = std::chrono::microseconds;

enum class MpaRole : std::uint8_t { kInitiator, kResponder };

// Ordered: a Responder configured for a dialect also accepts the ones below.
enum class MpaDialect : std::uint8_t {
  kV1 = 1,     // RFC 5044
  kV1Rtr = 2,  // RFC 5044 + Rtr/S-bit proposal (Rev 1, S bit, Rtr frame)
  kV2 = 3,     // RFC 6581 (Rev 2, enhanced bit, IRD/ORD word, RTR FPDU)
};
std::string_view MpaDialectName(MpaDialect d);

// C bit handling. RFC 5044 7.1.1: C = 1 in either frame means both ends
// generate and check CRCs.
enum class CrcPolicy : std::uint8_t {
  kRequire,  // send C = 1
  kAllow,    // send C = 0; use CRC if the peer sets C
  kRefuse,   // send C = 0; refuse a peer that sets C
};

// RFC 6581 ready-to-receive message the Initiator sends first in
// peer-to-peer mode.
enum class RtrType : std::uint8_t { kNone, kSend, kWrite, kRead };
std::string_view RtrTypeName(RtrType t);

struct RtrTypeSet {
  bool send = false;  // zero-length Send: consumes a posted Receive at the Responder
  bool write = true;  // zero-length RDMA Write: invisible to the Responder's ULP
  bool read = true;   // zero-length RDMA Read: needs an ORD/IRD slot
};

// When the local end may send its first FPDU.
enum class FirstSendRule : std::uint8_t {
  kMayNow,          // at once
  kRtrFpduFirst,    // Initiator, RFC 6581 peer-to-peer: the RTR FPDU (rtr_type) goes first
  kAfterFirstFpdu,  // Responder: receive and validate one FPDU first (RFC 5044 7.1.2 rule 4)
};
std::string_view FirstSendRuleName(FirstSendRule r);

struct NegotiatorConfig {
  MpaRole role = MpaRole::kInitiator;
  MpaDialect dialect = MpaDialect::kV2;  // Initiator: offered; Responder: highest accepted
  CrcPolicy crc = CrcPolicy::kAllow;
  bool markers_wanted = false;   // our M bit: the peer must insert markers toward us
  bool markers_can_send = true;  // false: refuse a peer whose M bit asks us for markers
  // Initiator only (the Responder gives its limits to Accept()): the IRD/ORD
  // offered in a v2 Request, at most kMaxIrdOrd. Without v2 they are not
  // exchanged and are reported back unchanged.
  std::uint16_t ird = 1;
  std::uint16_t ord = 1;
  // Initiator only: ask for RFC 6581 peer-to-peer mode (v2). A Responder
  // grants peer-to-peer whenever it shares an RTR type with the offer.
  bool peer_to_peer = false;
  RtrTypeSet rtr_types;  // Initiator: types it can send; Responder: types it accepts
  // Every wait for a startup frame (Reply, Request, Rtr): RFC 5044 7.1.2
  // rules 8 and 10. Must be positive.
  MpaTime startup_timeout = std::chrono::seconds(10);
  // Responder: wait for the first FPDU after an accepting Reply without Rtr.
  // Zero disables it.
  MpaTime first_fpdu_timeout = std::chrono::seconds(10);
};

enum class NegotiatorState : std::uint8_t {
  kIdle,               // not started
  kAwaitingReply,      // Initiator: Request sent
  kAwaitingRequest,    // Responder
  kAwaitingConsumer,   // Responder: kRequestReceived raised, Accept/Reject pending
  kAwaitingRtr,        // Responder, S-bit dialect: accepting Reply sent
  kAwaitingFirstFpdu,  // Responder: established; engine must call NoteFirstFpduReceived()
  kFullOperation,      // established; negotiation over
  kRejected,           // terminal: MPA exited, TCP left open
  kFailed,             // terminal: close TCP
};
std::string_view NegotiatorStateName(NegotiatorState s);

// Detail of a kFailed or locally decided kRejected event.
enum class StartupFailure : std::uint8_t {
  kNone,
  kBadKey,              // RFC 5044 7.1.2 rule 5
  kBadRevision,         // Rev 0, 3+, or an Rtr frame not in Rev 1
  kPrivateDataTooLong,  // PD_Length > 512 (rule 9)
  kMissingIrdOrd,       // RFC 6581: enhanced with PD_Length < 4
  kInitiatorInitiator,  // Initiator received a Request (rule 8)
  kUnexpectedFrame,     // a valid frame of the wrong kind for the state
  kRevisionMismatch,    // Reply revision above the Request's
  kEnhancedMismatch,    // Rev 2 Reply that drops the enhanced bit of our Request
  kRtrCrcMismatch,      // Rtr frame's C differs from the Reply's (proposal)
  kCrcRefused,          // peer set C, local policy refuses CRC
  kMarkersRefused,      // peer asked for markers, we cannot send them
  kInsufficientIrd,     // RFC 6581: Responder ORD above our IRD (Terminate LLP code 6)
  kNoMatchingRtr,       // RFC 6581: no acceptable RTR type (Terminate LLP code 7)
  kTimeout,             // a startup frame did not arrive in time (rule 10)
  kFirstFpduTimeout,    // Responder: no first FPDU in time
  kConnectionClosed,    // the transport reported the TCP connection gone
};
std::string_view StartupFailureName(StartupFailure f);

enum class NegotiatorEventType : std::uint8_t {
  kRequestReceived,  // Responder: see offer(); call Accept() or Reject()
  kEstablished,      // Full Operation may begin; see params()
  kRejected,         // R = 1 Reply received (by_peer) or sent by local policy
  kFailed,           // close the TCP connection
};
std::string_view NegotiatorEventTypeName(NegotiatorEventType t);

struct NegotiatorEvent {
  NegotiatorEventType type = NegotiatorEventType::kFailed;
  MpaError error = MpaError::kNone;  // kFailed only
  StartupFailure failure = StartupFailure::kNone;
  bool by_peer = false;  // kRejected: the peer sent R = 1
  std::string reason;    // for logs; empty for kEstablished
};

// What the Request offered, as the Responder sees it.
struct StartupOffer {
  std::uint8_t revision = 0;
  MpaDialect dialect = MpaDialect::kV1;         // what the Request asks for
  bool markers = false;                         // M: we must send markers
  bool crc = false;                             // C
  std::uint8_t reserved_bits = 0;               // Res as received (not checked, RFC 5044 7.1.1)
  std::optional<IrdOrdWord> ird_ord;            // v2 only
  MpaDialect answer_dialect = MpaDialect::kV1;  // what Accept() will answer in
  RtrType rtr = RtrType::kNone;                 // RFC 6581 RTR Accept() will grant
  std::vector<std::uint8_t> private_data;       // ULP private data (IRD/ORD word removed)
};

struct NegotiatedParams {
  MpaDialect dialect = MpaDialect::kV1;
  std::uint8_t revision = kMpaRevision1;  // of the Reply
  bool crc = false;                       // CRCs generated and checked both ways
  bool markers_tx = false;                // we insert markers into FPDUs we send
  bool markers_rx = false;                // the peer inserts markers into FPDUs we receive
  bool ird_ord_exchanged = false;         // false: ird/ord are the local values, unexchanged
  std::uint16_t ird = 0;                  // RDMA Read Requests we accept at once
  std::uint16_t ord = 0;                  // RDMA Read Requests we may have outstanding
  bool peer_to_peer = false;              // RFC 6581 RTR in use
  RtrType rtr = RtrType::kNone;
  FirstSendRule first_send = FirstSendRule::kMayNow;
  std::vector<std::uint8_t> local_private_data;  // ULP private data we sent
  std::vector<std::uint8_t> peer_private_data;   // ULP private data we received
};

enum class NegotiatorStatus : std::uint8_t {
  kOk,
  kWrongState,          // the call does not fit the current state or role
  kInvalidConfig,       // bad NegotiatorConfig (Start only); nothing sent
  kInvalidArgument,     // IRD/ORD above 0x3FFF, or a Read RTR granted with IRD 0
  kPrivateDataTooLong,  // over 512 octets (508 when the v2 IRD/ORD word goes first)
};
std::string_view NegotiatorStatusName(NegotiatorStatus s);

class MpaNegotiator {
 public:
  explicit MpaNegotiator(const NegotiatorConfig& config);
  MpaNegotiator(const MpaNegotiator&) = delete;
  MpaNegotiator& operator=(const MpaNegotiator&) = delete;

  // Initiator: queues the Request with `private_data`. Responder: starts the
  // wait for the Request; `private_data` must be empty.
  NegotiatorStatus Start(MpaTime now, ByteSpan private_data = {});

  // Offers received octets; returns how many belong to startup frames. Call
  // again with the rest only after handling events (the state may have
  // moved past the point where startup frames are expected).
  std::size_t Feed(MpaTime now, ByteSpan bytes);

  // Fires a startup timeout if `now` has reached Deadline().
  void OnTime(MpaTime now);

  // Responder, in kAwaitingConsumer. `ird`/`ord` are the local limits; with
  // v2 the Reply carries min(ird, peer ORD) and min(ord, peer IRD).
  NegotiatorStatus Accept(MpaTime now, ByteSpan private_data, std::uint16_t ird, std::uint16_t ord);
  // Responder, in kAwaitingConsumer: Reply with R = 1; terminal, no event.
  NegotiatorStatus Reject(ByteSpan private_data);

  // Responder in kAwaitingFirstFpdu: the engine validated the first FPDU.
  void NoteFirstFpduReceived();
  // The transport saw FIN, RST or an error before establishment.
  void OnConnectionClosed();

  // Octets to send, in order; ConsumeOutput(n) after n were written.
  ByteSpan PendingOutput() const;
  void ConsumeOutput(std::size_t n);

  std::optional<NegotiatorEvent> NextEvent();
  std::optional<MpaTime> Deadline() const { return deadline_; }

  NegotiatorState state() const { return state_; }
  MpaRole role() const { return config_.role; }
  const NegotiatorConfig& config() const { return config_; }
  // Responder: valid from kRequestReceived on.
  const StartupOffer& offer() const { return offer_; }
  // Valid from kEstablished on; after a received reject, peer_private_data
  // holds the rejecting Reply's private data.
  const NegotiatedParams& params() const { return params_; }

 private:
  bool ExpectingFrame() const;
  void HandleFrame(const StartupFrameView& frame);
  void HandleRequest(const StartupFrameView& frame);
  void HandleReply(const StartupFrameView& frame);
  void HandleRtr(const StartupFrameView& frame);
  void RejectLocally(StartupFailure failure, std::string reason);
  void Fail(MpaError error, StartupFailure failure, std::string reason);
  void Emit(NegotiatorEvent event);
  void Send(const StartupFrameSpec& spec);
  std::size_t MaxUlpPrivateData(MpaDialect dialect) const;

  NegotiatorConfig config_;
  NegotiatorState state_ = NegotiatorState::kIdle;
  std::optional<MpaTime> deadline_;

  // Partial startup frame, at most 20 + 512 octets.
  std::vector<std::uint8_t> frame_;

  std::vector<std::uint8_t> output_;
  std::size_t output_sent_ = 0;
  std::deque<NegotiatorEvent> events_;

  // What our Request said (Initiator).
  std::uint8_t sent_revision_ = kMpaRevision1;
  bool sent_crc_ = false;
  bool sent_s_bit_ = false;
  RtrTypeSet offered_rtr_;

  StartupOffer offer_;
  std::uint8_t answer_revision_ = kMpaRevision1;
  NegotiatedParams params_;
};

}  // namespace siwx::mpa
