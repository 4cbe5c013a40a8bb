// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The QP state machine: iWARP verbs states, their ibv_qp_state names, the
// modify transitions applications may request, the events that move a QP on
// their own, and which posts each state accepts.
//
// QpState has one value per ibv_qp_state and the same numbers, so the
// provider can cast (and static_asserts it). The iWARP verbs states (the
// RDMAC verbs that RFC 5040 is written against, as Linux iWARP drivers use
// them) are a coarser view, IwarpStateOf():
//
//   QpState     ibv            iWARP     meaning here
//   kReset      IBV_QPS_RESET  Idle      created or reset; no queues usable
//   kInit       IBV_QPS_INIT   Idle      receives may be posted
//   kRtr        IBV_QPS_RTR    RTR       ready to receive, stream not attached
//   kRts        IBV_QPS_RTS    RTS       stream attached, MPA done: data moves
//   kClosing    IBV_QPS_SQD    Closing   LLP being closed gracefully
//   kTerminate  IBV_QPS_SQE    Terminate a Terminate was sent or received
//   kError      IBV_QPS_ERR    Error     WRs are flushed
//
// Requested transitions (ibv_modify_qp), the IB table cut to what iWARP can
// do: RESET->INIT, INIT->INIT, INIT->RTR, RTS->RTS, RTS->SQD (graceful
// close), SQD->SQD, any->ERR, any->RESET. A QP enters RTS only through the
// kConnectionEstablished event (an iWARP QP cannot send before its stream is
// attached), and never comes back from Closing or Terminate to RTS (the IB
// SQD->RTS and SQE->RTS recoveries have no iWARP meaning).
//
// Events (from the CM and the data path):
//   kConnectionEstablished  INIT/RTR -> RTS
//   kPeerClosing            RTS -> Closing (TCP FIN from the peer)
//   kTerminateSent          RTS/Closing -> Terminate (we report an error)
//   kTerminateReceived      RTS/Closing -> Terminate (the peer reported one)
//   kLlpClosed              INIT/RTR/RTS/Closing/Terminate -> Error
//   kLocalError             INIT/RTR/RTS/Closing/Terminate -> Error
// An event that does not apply in the current state changes nothing and
// returns kIgnored. After the LLP is gone the QP goes to Error, not back to
// Idle: applications expect ERR and flushed WRs after a disconnect, which is
// also what the Linux iWARP drivers do.
//
// Each transition lists the actions the engine must carry out (TransitionResult
// ::actions); the state machine itself does no I/O. Qp::ApplyTransition is
// the one place that carries them out.
//
// Threading: QpStateMachine keeps the state in one atomic and changes it by
// compare-and-swap, so modifies (application threads) and events (progress
// thread) may race; each call sees one consistent from-state and the result
// says which. state() is a single load, cheap enough for every post.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>

namespace siwx::engine {

// Values equal enum ibv_qp_state.
enum class QpState : std::uint8_t {
  kReset = 0,
  kInit = 1,
  kRtr = 2,
  kRts = 3,
  kClosing = 4,    // IBV_QPS_SQD
  kTerminate = 5,  // IBV_QPS_SQE
  kError = 6,
};
inline constexpr std::uint8_t kQpStateCount = 7;

enum class IwarpQpState : std::uint8_t { kIdle, kRtr, kRts, kClosing, kTerminate, kError };

enum class QpEvent : std::uint8_t {
  kConnectionEstablished,
  kPeerClosing,
  kTerminateSent,
  kTerminateReceived,
  kLlpClosed,
  kLocalError,
};
inline constexpr std::uint8_t kQpEventCount = 6;

enum class QpStatus : std::uint8_t {
  kOk = 0,
  kIllegalTransition,  // requested transition not allowed (EINVAL)
  kStateMismatch,      // IBV_QP_CUR_STATE given and wrong (EINVAL)
  kIgnored,            // event does not apply in this state; nothing changed
};

// What the engine must do for a transition (bit set).
enum QpAction : std::uint32_t {
  kQpActionNone = 0,
  kQpActionFlushQueues = 1u << 0,    // complete all outstanding WRs with WrFlushErr
  kQpActionDiscardQueues = 1u << 1,  // drop all WRs without completions, reset stream state
  kQpActionCloseLlp = 1u << 2,       // graceful close: FIN after queued output (incl. a Terminate)
  kQpActionAbortLlp = 1u << 3,       // abortive close (RST)
};

struct TransitionResult {
  QpStatus status = QpStatus::kIllegalTransition;
  QpState from = QpState::kReset;
  QpState to = QpState::kReset;  // == from unless status == kOk
  std::uint32_t actions = kQpActionNone;
};

// How a post is treated in a state.
enum class PostDisposition : std::uint8_t {
  kAccept,  // queue the WR
  kFlush,   // complete it at once with WrFlushErr (IB semantics in error states)
  kReject,  // fail the post (EINVAL)
};

IwarpQpState IwarpStateOf(QpState state);
std::string_view QpStateName(QpState state);
std::string_view QpEventName(QpEvent event);

// Pure transition functions (the table).
TransitionResult ModifyTransition(QpState from, QpState to);
TransitionResult EventTransition(QpState from, QpEvent event);

// ibv_post_send: accepted in RTS; flushed in Closing, Terminate and Error;
// rejected before the stream exists (RESET, INIT, RTR).
PostDisposition SendPostDisposition(QpState state);
// ibv_post_recv: accepted from INIT to Terminate (so buffers are ready before
// the first Send arrives); flushed in Error; rejected in RESET.
PostDisposition ReceivePostDisposition(QpState state);
// Whether inbound FPDUs are processed: RTS, and Closing until the peer's FIN.
bool ProcessesInbound(QpState state);
// Whether new send WRs are started: RTS only.
bool ProcessesSendQueue(QpState state);

// Small stateful wrapper: one QP's current state.
class QpStateMachine {
 public:
  QpStateMachine() = default;
  QpStateMachine(const QpStateMachine&) = delete;
  QpStateMachine& operator=(const QpStateMachine&) = delete;

  QpState state() const { return state_.load(std::memory_order_acquire); }

  // ibv_modify_qp with IBV_QP_STATE; `expected_current` is IBV_QP_CUR_STATE.
  TransitionResult Modify(QpState target, std::optional<QpState> expected_current = std::nullopt);
  TransitionResult Handle(QpEvent event);

  // A copy of the state kept up to date for readers in other processes
  // (`siwx stat`); set once, before any transition.
  void SetMirror(std::atomic<std::uint8_t>* mirror) {
    mirror_ = mirror;
    UpdateMirror();
  }

 private:
  void UpdateMirror();

  std::atomic<QpState> state_{QpState::kReset};
  std::atomic<std::uint8_t>* mirror_ = nullptr;
};

}  // namespace siwx::engine
