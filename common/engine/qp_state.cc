// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/qp_state.h"

namespace siwx::engine {
namespace {

// States with an attached LLP stream, which leaving by modify must abort.
bool HasStream(QpState s) {
  return s == QpState::kRts || s == QpState::kClosing || s == QpState::kTerminate;
}

std::uint32_t AbortIfStream(QpState s) {
  return HasStream(s) ? std::uint32_t{kQpActionAbortLlp} : std::uint32_t{kQpActionNone};
}

bool IsValid(QpState s) { return static_cast<std::uint8_t>(s) < kQpStateCount; }

TransitionResult Ok(QpState from, QpState to, std::uint32_t actions) {
  return {QpStatus::kOk, from, to, actions};
}
TransitionResult Refused(QpState from, QpStatus status) { return {status, from, from, kQpActionNone}; }

}  // namespace

IwarpQpState IwarpStateOf(QpState state) {
  switch (state) {
    case QpState::kReset:
    case QpState::kInit:
      return IwarpQpState::kIdle;
    case QpState::kRtr:
      return IwarpQpState::kRtr;
    case QpState::kRts:
      return IwarpQpState::kRts;
    case QpState::kClosing:
      return IwarpQpState::kClosing;
    case QpState::kTerminate:
      return IwarpQpState::kTerminate;
    case QpState::kError:
      return IwarpQpState::kError;
  }
  return IwarpQpState::kError;
}

std::string_view QpStateName(QpState state) {
  switch (state) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kClosing: return "SQD/CLOSING";
    case QpState::kTerminate: return "SQE/TERMINATE";
    case QpState::kError: return "ERR";
  }
  return "unknown";
}

std::string_view QpEventName(QpEvent event) {
  switch (event) {
    case QpEvent::kConnectionEstablished: return "connection established";
    case QpEvent::kPeerClosing: return "peer closing";
    case QpEvent::kTerminateSent: return "Terminate sent";
    case QpEvent::kTerminateReceived: return "Terminate received";
    case QpEvent::kLlpClosed: return "LLP closed";
    case QpEvent::kLocalError: return "local error";
  }
  return "unknown";
}

TransitionResult ModifyTransition(QpState from, QpState to) {
  if (!IsValid(from) || !IsValid(to)) return Refused(from, QpStatus::kIllegalTransition);

  // any -> RESET: WRs vanish without completions (verbs); a live stream is aborted.
  if (to == QpState::kReset) {
    if (from == QpState::kReset) return Ok(from, to, kQpActionNone);
    return Ok(from, to, kQpActionDiscardQueues | AbortIfStream(from));
  }
  // any -> ERR: WRs complete with WrFlushErr; a live stream is aborted.
  if (to == QpState::kError) {
    if (from == QpState::kError) return Ok(from, to, kQpActionNone);
    return Ok(from, to, kQpActionFlushQueues | AbortIfStream(from));
  }
  switch (from) {
    case QpState::kReset:
      if (to == QpState::kInit) return Ok(from, to, kQpActionNone);
      break;
    case QpState::kInit:
      if (to == QpState::kInit || to == QpState::kRtr) return Ok(from, to, kQpActionNone);
      break;
    case QpState::kRtr:
      break;  // RTS comes from kConnectionEstablished only
    case QpState::kRts:
      if (to == QpState::kRts) return Ok(from, to, kQpActionNone);  // attribute-only modify
      if (to == QpState::kClosing) return Ok(from, to, kQpActionCloseLlp);
      break;
    case QpState::kClosing:
      if (to == QpState::kClosing) return Ok(from, to, kQpActionNone);
      break;
    case QpState::kTerminate:
    case QpState::kError:
      break;
  }
  return Refused(from, QpStatus::kIllegalTransition);
}

TransitionResult EventTransition(QpState from, QpEvent event) {
  if (!IsValid(from)) return Refused(from, QpStatus::kIgnored);
  switch (event) {
    case QpEvent::kConnectionEstablished:
      if (from == QpState::kInit || from == QpState::kRtr) {
        return Ok(from, QpState::kRts, kQpActionNone);
      }
      break;
    case QpEvent::kPeerClosing:
      if (from == QpState::kRts) return Ok(from, QpState::kClosing, kQpActionCloseLlp);
      break;
    case QpEvent::kTerminateSent:
    case QpEvent::kTerminateReceived:
      // A Terminate ends the RDMAP stream (RFC 5040 error management):
      // nothing more is processed on it and the LLP is closed.
      if (from == QpState::kRts || from == QpState::kClosing) {
        return Ok(from, QpState::kTerminate, kQpActionCloseLlp);
      }
      break;
    case QpEvent::kLlpClosed:
      // The stream is already gone: nothing to abort, only WRs to flush.
      if (from != QpState::kReset && from != QpState::kError) {
        return Ok(from, QpState::kError, kQpActionFlushQueues);
      }
      break;
    case QpEvent::kLocalError:
      if (from != QpState::kReset && from != QpState::kError) {
        return Ok(from, QpState::kError,
                  kQpActionFlushQueues | AbortIfStream(from));
      }
      break;
  }
  return Refused(from, QpStatus::kIgnored);
}

PostDisposition SendPostDisposition(QpState state) {
  switch (state) {
    case QpState::kRts:
      return PostDisposition::kAccept;
    case QpState::kClosing:
    case QpState::kTerminate:
    case QpState::kError:
      return PostDisposition::kFlush;
    case QpState::kReset:
    case QpState::kInit:
    case QpState::kRtr:
      return PostDisposition::kReject;
  }
  return PostDisposition::kReject;
}

PostDisposition ReceivePostDisposition(QpState state) {
  switch (state) {
    case QpState::kInit:
    case QpState::kRtr:
    case QpState::kRts:
    case QpState::kClosing:
    case QpState::kTerminate:
      return PostDisposition::kAccept;
    case QpState::kError:
      return PostDisposition::kFlush;
    case QpState::kReset:
      return PostDisposition::kReject;
  }
  return PostDisposition::kReject;
}

bool ProcessesInbound(QpState state) {
  return state == QpState::kRts || state == QpState::kClosing;
}

bool ProcessesSendQueue(QpState state) { return state == QpState::kRts; }

void QpStateMachine::UpdateMirror() {
  if (mirror_ == nullptr) return;
  // The state now, not the one this transition made: of two racing
  // transitions the later store still shows the latest state.
  mirror_->store(static_cast<std::uint8_t>(state_.load(std::memory_order_acquire)),
                 std::memory_order_relaxed);
}

TransitionResult QpStateMachine::Modify(QpState target, std::optional<QpState> expected_current) {
  QpState current = state_.load(std::memory_order_acquire);
  for (;;) {
    if (expected_current && *expected_current != current) {
      return Refused(current, QpStatus::kStateMismatch);
    }
    const TransitionResult result = ModifyTransition(current, target);
    if (result.status != QpStatus::kOk) return result;
    if (state_.compare_exchange_weak(current, result.to, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      UpdateMirror();
      return result;
    }
    // `current` was reloaded by the failed exchange: decide again.
  }
}

TransitionResult QpStateMachine::Handle(QpEvent event) {
  QpState current = state_.load(std::memory_order_acquire);
  for (;;) {
    const TransitionResult result = EventTransition(current, event);
    if (result.status != QpStatus::kOk) return result;
    if (state_.compare_exchange_weak(current, result.to, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      UpdateMirror();
      return result;
    }
  }
}

}  // namespace siwx::engine
