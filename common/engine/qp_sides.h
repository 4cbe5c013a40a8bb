// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What the receive side (QpRx) and the transmit side (QpTx) of a QP may do
// to their QP: two narrow interfaces that Qp implements, in place of access
// to its private members. Everything they share with the QP (the SQ, ORQ,
// IRQ, the mailbox to the transmit side, the error path) goes through these
// calls, and each call states the lock it takes and what the caller must
// hold, so the lock discipline of qp.h is written where it is used.
//
// Threads: QpForRx is called only by the holder of the QP's rx_mutex_ (a
// receive turn: the progress thread, or an application thread in
// Qp::DriveFromPoll); QpForTx only by the holder of the transmit gate (an
// application thread in PostSend, or the progress thread). Neither caller
// holds queue_mutex_ or info_mutex_ when it calls (calls that take one say
// so); calls that complete WRs or kick the transmit side may run callbacks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/engine/completion.h"
#include "common/engine/memory.h"
#include "common/engine/qp_state.h"
#include "common/engine/work_request.h"
#include "common/stats/stats_file.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/terminate.h"

namespace siwx::engine {

// Asynchronous events. Values of the ibv ones equal enum ibv_event_type.
enum class AsyncEventType : std::uint32_t {
  kQpFatal = 1,            // IBV_EVENT_QP_FATAL: LLP failure, local catastrophe,
                           // or the peer's Terminate
  kQpRequestError = 2,     // IBV_EVENT_QP_REQ_ERR: an inbound message broke
                           // the protocol (opcode, version, QN, MSN, MO, length)
  kQpAccessError = 3,      // IBV_EVENT_QP_ACCESS_ERR: an inbound message broke
                           // a protection rule (STag, PD, rights, bounds)
  kQpLastWqeReached = 16,  // IBV_EVENT_QP_LAST_WQE_REACHED: SRQ QP left the stream
  kStreamClosed = 0x100,   // not an ibv event: the QP's stream is gone (for the CM)
};

// A Read Request we sent whose response has not fully arrived (the ORQ,
// RFC 5040 5.2). Written by the transmit side, consumed by the receive side.
struct OrqEntry {
  std::uint64_t seq = 0;        // SQ sequence number of the Read WR
  std::uint32_t msn = 0;        // QN 1 MSN the Read Request carried
  std::uint32_t sink_stag = 0;  // where the response must be placed
  std::uint64_t sink_to = 0;
  std::uint32_t size = 0;
  bool rtr = false;             // our zero-length RTR Read; no WR behind it
};

// A Read Request the peer sent, waiting for its response (the IRQ).
// Written by the receive side after validation, consumed by the transmit side.
struct IrqEntry {
  std::uint32_t sink_stag = 0;
  std::uint64_t sink_to = 0;
  std::uint32_t source_stag = 0;
  std::uint64_t source_to = 0;
  std::uint32_t size = 0;
};

// How the transmit side should wind down (posted by other threads through
// the QP's mailbox).
enum class TxClose : std::uint8_t {
  kNone = 0,
  kGraceful,  // send what was posted before the close, then FIN (Disconnect, peer FIN)
  kStop,      // abandon the message in progress, FIN (the peer's Terminate)
};

// What the QP's mailbox held for the transmit side.
struct TxMail {
  std::optional<rdmap::TerminateHeader> terminate;  // the Terminate to send last
  TxClose close = TxClose::kNone;
};

// What an error path decided; see QpForSide::RaiseError.
struct ErrorReport {
  rdmap::TerminateCause cause;
  // The Terminate to send; nullopt when none can or should be sent
  // (connection lost, peer's Terminate received, local abort).
  std::optional<rdmap::TerminateHeader> terminate;
  std::optional<AsyncEventType> event;
  bool peer_terminated = false;  // the peer's Terminate arrived
  bool abort = false;            // RST instead of FIN (the stream is unusable)
  // The SQ entry that failed, with its status (Read WR, local WR error).
  std::optional<std::uint64_t> failed_seq;
  WcStatus failed_status = WcStatus::kWrFlushErr;
  // Whether the transmit side is done with that entry, so it may complete
  // now; otherwise the status is applied when the queue is flushed.
  bool failed_now = true;
};

// Bumps a single-writer counter without a locked instruction.
inline void CounterAdd(std::atomic<std::uint64_t>& counter, std::uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// What both sides use. Calls without a lock note take none.
class QpForSide {
 public:
  virtual std::uint32_t qp_num() const = 0;
  virtual QpState state() const = 0;  // one atomic load
  // The STag table and the QP's PD, for every region check.
  virtual MemoryTable& memory() = 0;
  virtual PdId pd() const = 0;
  // The counters; each side writes only its own (rx_* or tx_*).
  virtual stats::QpCounterBlock& counters() = 0;
  // RX -> TX: we may transmit (the peer's RTR, or the first FPDU a
  // responder waits for, arrived; true at once otherwise). Acquire load.
  virtual bool RtrReceived() const = 0;

  // First error wins: records it, moves the state, hands the Terminate (if
  // any) to the transmit side, marks the failing WR, fires the event and
  // schedules finalization. False if an error was already raised. Takes
  // info_mutex_ and queue_mutex_; kicks the transmit side; may run callbacks.
  virtual bool RaiseError(const ErrorReport& report) = 0;
  // The stream is over for this side: asks the progress thread to finalize
  // the QP (`abort`: with RST). No lock; any thread.
  virtual void EndStream(bool abort) = 0;

 protected:
  ~QpForSide() = default;
};

// The receive side's view of its QP. Caller: the rx_mutex_ holder.
class QpForRx : public QpForSide {
 public:
  // ---- Untagged QN 0 ----
  // The next posted receive WR (own RQ or SRQ), nullopt if none. The RQ's
  // own lock.
  virtual std::optional<ReceiveWorkRequest> TakeReceive() = 0;
  // Pushes a receive completion to the receive CQ (in MSN order: only the
  // rx_mutex_ holder pushes them). Runs CQ callbacks.
  virtual void CompleteReceive(const WorkCompletion& wc, bool solicited) = 0;

  // ---- Our Reads (ORQ) ----
  // The oldest Read whose response has not fully arrived. queue_mutex_.
  virtual std::optional<OrqEntry> OldestRead() = 0;
  // Its response has been placed whole: pops it, completes its WR (not for
  // the RTR Read) in SQ order and kicks the transmit side (an ORD slot or a
  // fence may have opened). queue_mutex_, then the completion and transmit
  // gates; runs callbacks.
  virtual void CompleteOldestRead(const OrqEntry& read) = 0;

  // ---- The peer's Reads (IRQ) ----
  // Read Requests accepted whose response has not yet gone to the kernel
  // whole. queue_mutex_.
  virtual std::uint32_t ReadRequestsOutstanding() = 0;
  // Waits (yielding) while the transmit side is between a sendmsg and the
  // accounting of what it took, so ReadRequestsOutstanding afterwards counts
  // every response the peer can have received. Bounded; no lock.
  virtual void WaitForSendAccounting() const = 0;
  // Queues an accepted Read Request for the transmit side. queue_mutex_.
  virtual void QueueReadRequest(const IrqEntry& request) = 0;
  // Gives the transmit side a turn (the transmit gate; may run callbacks).
  virtual void KickTx() = 0;

  // ---- The peer's Terminate: which of our WRs its header copy names ----
  // Each takes queue_mutex_ and returns the SQ sequence number, if any:
  // the Read whose Read Request carried `msn` (QN 1), the unfinished Send
  // that went out with `msn` (QN 0), the unfinished Write to `stag`.
  virtual std::optional<std::uint64_t> FindReadByMsn(std::uint32_t msn) = 0;
  virtual std::optional<std::uint64_t> FindUnfinishedSendByMsn(std::uint32_t msn) = 0;
  virtual std::optional<std::uint64_t> FindUnfinishedWriteByStag(std::uint32_t stag) = 0;
  // Keeps the peer's Terminate for Query (first one only). info_mutex_.
  virtual void RecordTerminateReceived(const rdmap::TerminateHeader& header) = 0;

  // ---- Stream events ----
  // The RTR (or the first FPDU a responder waits for) arrived and was
  // validated: the transmit side may start. Kicks it.
  virtual void MarkRtrReceived() = 0;
  // The peer closed at a message boundary: the QP goes to Closing and the
  // transmit side sends what was posted, then FIN (qp_state.h kPeerClosing).
  // queue_mutex_; kicks the transmit side.
  virtual void OnPeerClosedInOrder() = 0;
  // The peer's FIN: no more read interest, but keep the socket polled for
  // writing. poll_mutex_.
  virtual void StopReading() = 0;
  // The socket is dead: out of the poller. poll_mutex_.
  virtual void StopPolling() = 0;
  // The QP is finalized already (WRs flushed; only the socket is left).
  virtual bool finalized() const = 0;

 protected:
  ~QpForRx() = default;
};

// A send WR as the transmit side finds it at a position of the SQ.
struct SqPeek {
  // The WR, stable until its entry completes (which needs it started first);
  // null at the tail or for a WR posted in a flush state (never started).
  const SendRecord* wr = nullptr;
  std::size_t reads_outstanding = 0;  // the ORQ's size (fences, ORD)
};

// The transmit side's view of its QP. Caller: the transmit-gate holder.
class QpForTx : public QpForSide {
 public:
  // The connected stream; set and reset only while the progress thread
  // holds the gate exclusively, so the holder may use it. Null when none.
  virtual transport::TcpStream* stream() = 0;
  // Write interest in the poller (EPOLLOUT while the socket is full);
  // false if the socket is no longer polled. poll_mutex_.
  virtual bool SetWriteInterest(bool want) = 0;
  // The pump stopped with nothing it could frame and nothing unsent: what
  // the SQ still holds waits for input (Read Responses, an ORD slot, a
  // fence, the peer's RTR). queue_mutex_.
  virtual void NoteTxIdle() = 0;
  // What other threads posted to the mailbox (a Terminate to send, how to
  // wind down), taken once; nullopt when nothing is waiting (one acquire
  // load). queue_mutex_ when there is mail.
  virtual std::optional<TxMail> TakeMail() = 0;

  // ---- SQ ----
  // The oldest WR not yet completed (where a new stream starts). queue_mutex_.
  virtual std::uint64_t SqHead() = 0;
  virtual SqPeek PeekSq(std::uint64_t seq) = 0;  // queue_mutex_
  // The QN 0 or QN 1 MSN WR `seq` went out with (for the peer's Terminate).
  virtual void SetSqMsn(std::uint64_t seq, std::uint32_t msn) = 0;  // queue_mutex_
  // WR `seq` completed successfully (unless it already failed); the caller
  // retires the SQ. queue_mutex_.
  virtual void MarkSqDone(std::uint64_t seq) = 0;
  // Pushes the completions of finished SQ entries at the head, in WR order
  // (the completion gate; runs callbacks).
  virtual void RetireSq() = 0;

  // ---- Reads ----
  // A Read Request (or our RTR Read) is about to be framed: into the ORQ,
  // before it can be on the wire, with its WR's MSN. queue_mutex_.
  virtual void PushOrq(const OrqEntry& read) = 0;
  // The oldest Read Request of the peer not yet being answered. queue_mutex_.
  virtual std::optional<IrqEntry> TakeReadRequest() = 0;
  // `count` Read Responses went to the kernel whole: their requests no
  // longer count against IRD. queue_mutex_.
  virtual void ResponsesSent(std::uint32_t count) = 0;
  // Brackets a sendmsg and the accounting of what it took (see
  // QpForRx::WaitForSendAccounting). Seq-cst store / release store.
  virtual void BeginSendAccounting() = 0;
  virtual void EndSendAccounting() = 0;

 protected:
  ~QpForTx() = default;
};

}  // namespace siwx::engine
