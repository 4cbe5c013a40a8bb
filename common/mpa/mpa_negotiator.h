// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
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
// Dialects. The Initiator offers exactly its configured dialect. The
// Responder answers
//  - an enhanced Request (Rev 2, S = 1) with an enhanced Reply when it is
//    configured for v2; configured below v2 it does not support enhanced
//    establishment, so it closes the connection without a Reply, which is
//    what RFC 6581 section 10 requires of such a responder;
//  - an unenhanced Request (S = 0, Rev 1 or 2) with an unenhanced Reply
//    (RFC 6581 10), keeping Rev 2 only when it is configured for v2;
//  - an S-bit Request (Rev 1, S = 1) with S set when configured for v1+Rtr
//    or v2, with S clear ("no Rtr frame", the proposal's fallback) for v1.
// The Initiator of an enhanced Request takes only an enhanced Reply: a Rev 1
// Reply, or a Rev 2 Reply without S, breaks RFC 6581 10 and fails the
// negotiation (the ULP may then retry with a v1 Request on a new
// connection, 10). The S-bit Initiator accepts a Reply with S clear.
//
// RFC 6581 enhanced establishment (sections 9.1-9.3):
//  - IRD/ORD. The Responder answers IRD = min(its IRD, Initiator ORD) and
//    ORD = min(its ORD, Initiator IRD), never an ORD above the Initiator's
//    IRD (9.1); 0x3FFF in either direction means "the ULP negotiates": the
//    other end keeps its local value and a Responder echoes 0x3FFF (9.1).
//    The Initiator sets IRD = Responder ORD and ORD = min(its ORD,
//    Responder IRD); a Responder ORD above the IRD it offered is
//    insufficient IRD (Terminate LLP/MPA code 6, 9.1). Both ends expose the
//    peer's word unchanged (9.1: "MUST pass ... to the ULP"), also from a
//    rejecting Reply.
//  - Connection model. A in the Reply echoes A in the Request (9.2). With
//    A = 1 the Responder advertises every offered RTR type it supports, or,
//    when it supports none of them, every type it supports (9.2); the
//    Initiator picks one (1.1: its "sole discretion"; here Write, then Read,
//    then Send) or, when none is usable or A came back 0, fails with
//    Terminate code 7 (9.2). B, C and D are ignored when A is 0 (9.2).
//  - RTR. The Initiator's first FPDU after the accepting Reply is the
//    zero-length RTR message, and nothing else may go before it (5, 9.3):
//    FirstSendRule::kRtrFpduFirst. The Responder sends no FPDU before that
//    first FPDU arrives (RFC 5044 7.1.2 rule 4; RFC 6581 3 "MPA Fencing").
//
// Octet ownership: Feed() consumes only startup-frame octets. Octets after a
// frame in the same call are left unconsumed: they belong to the FPDU stream
// (or, after a reject, to whatever the ULP does with the TCP connection).
// Feed() also consumes nothing while no frame is expected (before Start(),
// while the consumer decides, after establishment or a terminal event).
//
// Errors. Malformed or unexpected frames, policy conflicts and startup
// timeouts end the negotiation with a kFailed event carrying an MPA error
// code: RFC 5044 section 8 kInvalidStartupFrame (4), kConnectionLost (1) for
// a timeout or close, or RFC 6581 section 8 kInsufficientIrd (6) and
// kNoMatchingRtr (7). For the last two the Initiator has an accepting Reply
// in hand, so the event has send_terminate set: the engine sends a
// Terminate (layer LLP, error type MPA, that code), framed as params() says,
// and then closes (RFC 6581 9.1, 9.2). Otherwise the transport just closes.
// A reject (R = 1, sent or received) exits MPA with the TCP connection left
// open (RFC 5044 7.1.2 rules 2/3). Consumer mistakes (private data over the
// limit, a call in the wrong state) return a NegotiatorStatus and change
// nothing.
//
// Large FPDUs (Linux siw's experiment, the L bit of common/wire/mpa_startup.h;
// not an RFC feature). With NegotiatorConfig::large_fpdus the Initiator sets
// L in its Request, in every dialect, and the Responder sets L in an
// accepting Reply when the Request had it. Each end has agreed when the
// peer's frame carried L and its own did too: the Initiator when its
// Request and the Reply had it, the Responder when the Request had it and
// its Reply sets it. Then each may send FPDUs larger than MULPDU (RFC 5044
// 4.5); params().large_fpdus says so. A peer that does not know L never
// sets it (Res is zero when sending, RFC 5044 7.1.1), so with it nothing
// changes; a Linux siw Responder echoes the Request's L (its Reply is the
// Request header with a new key) and takes large FPDUs. Rejecting Replies
// and the Rtr frame never carry L.
//
// What it does not do: build or parse FPDUs (the RTR and the Terminate are
// the engine's; the negotiator says which), check that the first FPDU is one
// of the advertised RTR types, decide whether private data is acceptable
// (the consumer does), or enforce per-FPDU rules.
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
  kV2 = 3,     // RFC 6581 (Rev 2, S bit, IRD/ORD word, RTR FPDU)
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
// peer-to-peer mode (RFC 6581 1.1, 9.2).
enum class RtrType : std::uint8_t { kNone, kSend, kWrite, kRead };
std::string_view RtrTypeName(RtrType t);

struct RtrTypeSet {
  bool send = false;  // B: zero-length Send: consumes a posted Receive at the Responder
  bool write = true;  // C: zero-length RDMA Write: invisible to the Responder's ULP
  bool read = true;   // D: zero-length RDMA Read: needs an ORD/IRD slot

  bool Any() const { return send || write || read; }
  friend bool operator==(const RtrTypeSet&, const RtrTypeSet&) = default;
};

// When the local end may send its first FPDU.
enum class FirstSendRule : std::uint8_t {
  kMayNow,          // at once
  kRtrFpduFirst,    // Initiator, RFC 6581 peer-to-peer: the RTR FPDU (params().rtr) goes first
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
  // offered in a v2 Request, at most kMaxIrdOrd; kIrdOrdNotNegotiated
  // (0x3FFF) leaves that value to the ULP (RFC 6581 9.1). Without v2 they
  // are not exchanged and are reported back unchanged.
  std::uint16_t ird = 1;
  std::uint16_t ord = 1;
  // Initiator only: ask for the RFC 6581 peer-to-peer model (A = 1, v2).
  bool peer_to_peer = false;
  // Initiator: the RTR types it can send, all offered with A = 1 (9.2).
  // Responder: the types it accepts; with v2 at least one (9.2: a responder
  // supporting enhanced establishment MUST support one), else Start()
  // returns kInvalidConfig.
  RtrTypeSet rtr_types;
  // Offer (Initiator) or accept (Responder) FPDUs larger than MULPDU: the
  // L bit, see "Large FPDUs" above.
  bool large_fpdus = false;
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
  kMissingIrdOrd,       // RFC 6581 6: Rev 2 + S with PD_Length < 4
  kInitiatorInitiator,  // Initiator received a Request (rule 8)
  kUnexpectedFrame,     // a valid frame of the wrong kind for the state
  kRevisionMismatch,    // Reply revision above the Request's
  kEnhancedMismatch,    // unenhanced Reply (Rev 1, or Rev 2 without S) to our enhanced
                        // Request (RFC 6581 10)
  kRtrCrcMismatch,      // Rtr frame's C differs from the Reply's (proposal)
  kCrcRefused,          // peer set C, local policy refuses CRC
  kMarkersRefused,      // peer asked for markers, we cannot send them
  kInsufficientIrd,     // RFC 6581 9.1: Responder ORD above our IRD (Terminate LLP code 6)
  kNoMatchingRtr,       // RFC 6581 9.2: A = 0 or no usable RTR type (Terminate LLP code 7)
  kTimeout,             // a startup frame did not arrive in time (rule 10)
  kFirstFpduTimeout,    // Responder: no first FPDU in time
  kConnectionClosed,    // the transport reported the TCP connection gone
  kEnhancedUnsupported,  // Responder below v2 got an enhanced Request (RFC 6581 10)
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
  // kFailed only: send a Terminate with layer LLP, error type MPA and code
  // `error`, in the FPDU framing of params(), before closing (RFC 6581 8,
  // 9.1, 9.2). Set for kInsufficientIrd and kNoMatchingRtr.
  bool send_terminate = false;
};

// What the Request offered, as the Responder sees it.
struct StartupOffer {
  std::uint8_t revision = 0;
  MpaDialect dialect = MpaDialect::kV1;         // what the Request asks for
  bool markers = false;                         // M: we must send markers
  bool crc = false;                             // C
  bool large_fpdus = false;                     // L: the Initiator offers large FPDUs
  std::uint8_t reserved_bits = 0;               // Res (L aside) as received (not checked,
                                                // RFC 5044 7.1.1)
  std::optional<IrdOrdWord> ird_ord;            // v2 only, as received
  MpaDialect answer_dialect = MpaDialect::kV1;  // what Accept() will answer in
  bool peer_to_peer = false;                    // v2 with A = 1: the Reply echoes A (9.2)
  // With peer_to_peer: the RTR types the Reply will advertise (9.2), the
  // offered ones this end accepts or, if none, all it accepts. Accept()
  // drops Read when it is given IRD 0.
  RtrTypeSet rtr_types{false, false, false};
  std::vector<std::uint8_t> private_data;       // ULP private data (IRD/ORD word removed)
};

struct NegotiatedParams {
  MpaDialect dialect = MpaDialect::kV1;
  std::uint8_t revision = kMpaRevision1;  // of the Reply
  bool crc = false;                       // CRCs generated and checked both ways
  bool markers_tx = false;                // we insert markers into FPDUs we send
  bool markers_rx = false;                // the peer inserts markers into FPDUs we receive
  // Both frames carried L: either end may send FPDUs above MULPDU (see
  // "Large FPDUs" above).
  bool large_fpdus = false;
  bool ird_ord_exchanged = false;         // false: ird/ord are the local values, unexchanged
  std::uint16_t ird = 0;                  // RDMA Read Requests we accept at once
  std::uint16_t ord = 0;                  // RDMA Read Requests we may have outstanding
  // The peer's IRD/ORD word as received, for the ULP (RFC 6581 9.1); also
  // set from a rejecting v2 Reply and when the Initiator fails on it.
  std::optional<IrdOrdWord> peer_ird_ord;
  bool peer_to_peer = false;  // RFC 6581 peer-to-peer model (A = 1) agreed
  // RTR types advertised in the Reply (9.2). Responder: the first FPDU must
  // be one of these; the Initiator chooses which (1.1).
  RtrTypeSet rtr_types{false, false, false};
  // Initiator: the RTR it sends as its first FPDU. Responder: kNone (the
  // choice is the Initiator's).
  RtrType rtr = RtrType::kNone;
  FirstSendRule first_send = FirstSendRule::kMayNow;
  std::vector<std::uint8_t> local_private_data;  // ULP private data we sent
  std::vector<std::uint8_t> peer_private_data;   // ULP private data we received
};

enum class NegotiatorStatus : std::uint8_t {
  kOk,
  kWrongState,          // the call does not fit the current state or role
  kInvalidConfig,       // bad NegotiatorConfig (Start only); nothing sent
  kInvalidArgument,     // IRD/ORD above 0x3FFF, or only a Read RTR to grant and IRD 0
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
  // v2 the Reply carries min(ird, peer ORD) and min(ord, peer IRD), 0x3FFF
  // where the peer sent 0x3FFF (RFC 6581 9.1), and IRD at least 1 when a
  // Read RTR is advertised (9.1 allows raising it for that).
  NegotiatorStatus Accept(MpaTime now, ByteSpan private_data, std::uint16_t ird, std::uint16_t ord);
  // Responder, in kAwaitingConsumer: Reply with R = 1; terminal, no event.
  // With v2 the Reply's word carries `ird`/`ord`, e.g. the ORD the ULP
  // requires when the Initiator's IRD was too small (RFC 6581 9.1), and A
  // (with the RTR types) echoed as in an accepting Reply (9.2).
  NegotiatorStatus Reject(ByteSpan private_data, std::uint16_t ird = 0, std::uint16_t ord = 0);

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
  void SendReject(ByteSpan private_data, std::uint16_t ird, std::uint16_t ord);
  void Fail(MpaError error, StartupFailure failure, std::string reason,
            bool send_terminate = false);
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
  bool sent_large_fpdus_ = false;
  RtrTypeSet offered_rtr_;

  StartupOffer offer_;
  std::uint8_t answer_revision_ = kMpaRevision1;
  NegotiatedParams params_;
};

}  // namespace siwx::mpa
