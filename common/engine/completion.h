// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Work completions and the completion queue.
//
// WorkCompletion mirrors struct ibv_wc field by field, in host order. The
// numeric values of WcStatus, WcOpcode and the WcFlags bits equal those of
// enum ibv_wc_status, ibv_wc_opcode and ibv_wc_flags, so the provider can cast
// them; common/ cannot include verbs.h, so the provider static_asserts this.
//
// CompletionQueue is a bounded ring of `capacity` entries.
//  - Producers (the progress thread, and application threads that complete
//    work inline) call Push from any thread.
//  - Consumers call Poll for a batch. An empty CQ is detected with one atomic
//    load and no lock.
//  - Overflow: a Push into a full ring stores nothing, puts the CQ in error
//    and reports kCqError once through the async-event callback
//    (IBV_EVENT_CQ_ERR). Completions are never overwritten; every later Push
//    is refused too, since the consumer has already lost one (RFC 5042 6.4.6:
//    an overflow must not hurt streams that do not use this CQ, which is why
//    the CQ, not the whole device, goes to error).
//  - Arming (ibv_req_notify_cq): Arm(kNextCompletion) fires the completion
//    callback for the next pushed entry; Arm(kSolicited) only for the next
//    entry that is solicited or unsuccessful. One arm gives at most one
//    notification; arming for "next" while armed for "solicited" widens the
//    arm, never narrows it. Entries already queued do not fire.
//  - Both callbacks run on the pushing thread after the lock is released, so
//    they may poll or re-arm this CQ. They must not block for long.
//
// Locking: `mutex_` guards the ring indices, the entries and the arm state.
// `count_` mirrors the number of queued entries for the lock-free empty
// check; it is written only under `mutex_`. `in_error_` is written under
// `mutex_` and may be read without it.
//
// Not here yet: resize (ibv_resize_cq).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

namespace siwx::engine {

// Values equal enum ibv_wc_status.
enum class WcStatus : std::uint32_t {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocEecOpErr = 3,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kMwBindErr = 6,
  kBadRespErr = 7,
  kLocAccessErr = 8,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kLocRddViolErr = 14,
  kRemInvRdReqErr = 15,
  kRemAbortErr = 16,
  kInvEecnErr = 17,
  kInvEecStateErr = 18,
  kFatalErr = 19,
  kRespTimeoutErr = 20,
  kGeneralErr = 21,
};

// Values equal enum ibv_wc_opcode.
enum class WcOpcode : std::uint32_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kBindMw = 5,
  kLocalInv = 6,
  kRecv = 1u << 7,  // receive completions have this bit set
  kRecvRdmaWithImm = (1u << 7) + 1,
};

// Bits equal enum ibv_wc_flags.
enum WcFlags : std::uint32_t {
  kWcWithImm = 1u << 1,  // IBV_WC_WITH_IMM
  kWcWithInv = 1u << 3,  // IBV_WC_WITH_INV: the Send invalidated invalidated_rkey
};

struct WorkCompletion {
  std::uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  std::uint32_t vendor_err = 0;
  std::uint32_t byte_len = 0;
  std::uint32_t imm_data = 0;          // host order; valid with kWcWithImm
  std::uint32_t invalidated_rkey = 0;  // valid with kWcWithInv
  std::uint32_t qp_num = 0;
  std::uint32_t src_qp = 0;
  std::uint32_t wc_flags = 0;          // WcFlags bits
};

std::string_view WcStatusName(WcStatus status);

enum class CqArm : std::uint8_t {
  kNone = 0,
  kSolicited,       // ibv_req_notify_cq(cq, 1)
  kNextCompletion,  // ibv_req_notify_cq(cq, 0)
};

enum class CqEvent : std::uint8_t {
  kCqError,  // IBV_EVENT_CQ_ERR: the ring overflowed
};

// Which queued entries of a destroyed QP RemoveQp takes out.
enum class QpEntries : std::uint8_t {
  kAll,
  kAllButReceives,  // receive completions (kRecv bit) stay: an SRQ QP's name SRQ WRs
};

class CompletionQueue;

// Work that can produce completions on a CQ when an application thread polls
// it empty: a QP's receive side (Qp::DriveFromPoll). The CQ only calls it;
// the driver decides whether it may run on the calling thread and whether
// anything it could do would complete on `polled`.
class PollDriver {
 public:
  virtual ~PollDriver() = default;
  virtual void DriveFromPoll(const CompletionQueue& polled) = 0;
  // `cq` was armed (ibv_req_notify_cq): its application is about to sleep
  // and no longer drives; whatever progress driving held back must resume.
  virtual void OnCqArmed(const CompletionQueue& cq) = 0;
  // Asked after an empty poll of `polled` that may wait (set_poll_wait):
  // true only when nothing the polling thread could do for this driver
  // would complete anything on `polled`, so every completion it can still
  // get is pushed by another thread (which ends the wait). Default: never.
  virtual bool PollMayWait(const CompletionQueue& /*polled*/) { return false; }
  // Transmits what posts left for the next poll (CompletionQueue::NoteTxOwed).
  virtual void FlushOwedTx() {}
  // Asked after PollMayWait said true: whether a push is under way, so the
  // wait may last up to kPollWaitForDuePush (a bulk stream comes in that the
  // progress thread reads, or a full socket drains). Default: never.
  virtual bool PollPushDue() { return false; }
  // Asked after PollMayWait said true, when this is the CQ's only driver:
  // the polling thread reads this driver's input itself (it holds the read
  // lease of a bulk receiver or of a bulk Read requester) and may sleep
  // until that input is readable instead of on `polled`, for at most `max`.
  // True if it slept: the CQ then gives it a turn at once. Default: it
  // cannot (the CQ's own wait follows).
  virtual bool WaitForInput(const CompletionQueue& /*polled*/,
                            std::chrono::nanoseconds /*max*/) {
    return false;
  }
  // Asked after an empty poll: takes the transmit turns the driver's engine
  // shares with polling threads (Engine::HelpTransmit); true if it took
  // any. Default: none.
  virtual bool HelpTransmit() { return false; }
  // Asked after a poll of `polled` returned completions, when this driver
  // said it awaits an answer (CompletionQueue::NoteAnswerAwaited): the
  // polling thread may wait for it here, reading the driver's input itself,
  // before the poll returns. Default: nothing to wait for.
  virtual void AwaitAnswer(const CompletionQueue& /*polled*/) {}
};

enum class PushStatus : std::uint8_t {
  kOk = 0,
  kOverflow,  // this push found the ring full; the CQ is now in error
  kInError,   // the CQ was already in error; nothing stored
};

class CompletionQueue {
 public:
  // Entries an engine CQ may hold (a sanity bound; the provider advertises
  // its own max_cqe not above this).
  static constexpr std::uint32_t kMaxCapacity = 1u << 20;

  struct Callbacks {
    std::function<void()> on_completion;       // an armed notification fired
    std::function<void(CqEvent)> on_async_event;
  };

  // nullptr if capacity is 0 or above kMaxCapacity.
  static std::unique_ptr<CompletionQueue> Create(std::uint32_t capacity, Callbacks callbacks);

  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // `solicited` is true for a receive completion of a message with the
  // Solicited Event bit set (RFC 5040 Send with SE). Unsuccessful
  // completions count as solicited on their own (ibv_req_notify_cq(3)).
  PushStatus Push(const WorkCompletion& wc, bool solicited = false);

  // Moves up to out.size() of the oldest entries into `out`; returns how many.
  std::size_t Poll(std::span<WorkCompletion> out);
  // Poll; when the CQ is empty, first gives up to kDriversPerEmptyPoll
  // registered drivers (round-robin) one turn each on this thread
  // (ibv_poll_cq: an application spinning on the CQ makes receive progress
  // itself instead of waiting for the progress thread to be scheduled).
  // Only one thread drives at a time; the others, and calls made from
  // inside a driver (callbacks), only poll.
  // A thread whose last 256 calls (SetEmptyPollsBeforeYield) found nothing,
  // on any CQ, calls sched_yield at the start of every further empty one
  // until one returns completions: a busy-polling application then runs only
  // when no other thread wants its CPU, such as the progress thread or the
  // thread that moves the data it waits for (docs/performance-notes.md 3.5).
  std::size_t PollWithProgress(std::span<WorkCompletion> out);
  static constexpr std::size_t kDriversPerEmptyPoll = 4;
  static constexpr std::uint32_t kDefaultEmptyPollsBeforeYield = 256;
  // Process-wide; 0: never yield (tests that time single polls).
  static void SetEmptyPollsBeforeYield(std::uint32_t polls);
  // How often PollWithProgress yielded on the calling thread.
  static std::uint64_t YieldsOnThisThread();

  // Wake-ups of pollers sleeping in PollWithProgress's bounded wait, for
  // pushes made on the calling thread: with `defer` (the engine's progress
  // thread), a push that finds a poller waiting does not wake it at once
  // but when WakeDeferred runs (the thread is done with what it read, and
  // calls it before it sleeps or runs anything that may block), or once
  // kWakeBatch entries are queued. The entry is in the ring at once; only
  // the wake-up waits, for at most one turn of that thread. A receiver of
  // 64 KiB Sends was woken once per message, several times per turn of the
  // progress thread (docs/performance-notes.md 3.10).
  static void DeferWakesOnThisThread(bool defer);
  static void WakeDeferred();
  static constexpr std::size_t kWakeBatch = 16;
  // How many times this CQ woke its waiting pollers (tests).
  std::uint64_t waiter_wakes() const { return waiter_wakes_.load(std::memory_order_relaxed); }

  // Bounded wait of PollWithProgress (SIWX_POLL_WAIT_US; zero: never waits).
  // When the CQ is still empty after the drivers' turns and every driver
  // says PollMayWait (typically: its socket is full and only the progress
  // thread's EPOLLOUT moves it), the poll sleeps until the next Push or for
  // at most this long, instead of returning at once to a caller that would
  // spin. A Push ends the wait at once, so no completion is held back.
  // A wait that runs out with nothing pushed doubles the next one, up to
  // kMaxPollWait (poll_wait_backoff.h); a poll that returns entries, a wait
  // that a Push ends, or an empty poll that may not wait go back to `wait`.
  // Set before the CQ is used.
  // A wait where some driver says PollPushDue lasts up to
  // kPollWaitForDuePush instead: the push that ends it is coming, and a
  // 64 KiB Send receiver timed out 50 us waits several times per message,
  // each a wake-up of its own (docs/performance-notes.md 3.12).
  static constexpr std::chrono::microseconds kPollWaitForDuePush{1000};
  // Process-wide: an engine's progress thread started (true) or stopped
  // (false) its responder spin (responder_spin.h). While any spins, waits
  // that run out grow up to kMaxPollWaitBesideSpin (poll_wait_backoff.h).
  static void NoteResponderSpin(bool spinning);
  static bool AnyResponderSpins();
  void set_poll_wait(std::chrono::microseconds wait) {
    poll_wait_ = wait;
    next_poll_wait_us_.store(wait.count(), std::memory_order_relaxed);
  }
  std::chrono::microseconds poll_wait() const { return poll_wait_; }
  // How long the next wait may last (tests).
  std::chrono::microseconds next_poll_wait() const {
    return std::chrono::microseconds(next_poll_wait_us_.load(std::memory_order_relaxed));
  }
  // How many polls waited, and how many of those waits ran out instead of
  // ending with a Push (for tests).
  std::uint64_t poll_waits() const { return poll_waits_.load(std::memory_order_relaxed); }
  // Waits that a due push allowed to last kPollWaitForDuePush (tests).
  std::uint64_t long_poll_waits() const {
    return long_poll_waits_.load(std::memory_order_relaxed);
  }
  std::uint64_t poll_wait_timeouts() const {
    return poll_wait_timeouts_.load(std::memory_order_relaxed);
  }
  // Waits a driver slept on its own input (PollDriver::WaitForInput; tests).
  std::uint64_t input_waits() const { return input_waits_.load(std::memory_order_relaxed); }

  // A driver left posted work untransmitted until the next poll of this CQ
  // (Qp::PostSendList coalesces back-to-back posts): the next Poll, on any
  // thread, first has every driver transmit it (PollDriver::FlushOwedTx).
  void NoteTxOwed() { tx_owed_.store(true, std::memory_order_release); }
  // The progress thread shares transmit turns (Engine::ShareTransmitTurns):
  // if a thread sleeps in a poll of this CQ, its wait ends so that it helps.
  // False if none sleeps.
  bool WakeToHelp();
  // A driver's last post expects an answer that its application waits for
  // outside verbs: the next poll that returns completions lets the drivers
  // wait for it (PollDriver::AwaitAnswer).
  void NoteAnswerAwaited() { answer_awaited_.store(true, std::memory_order_release); }
  // Poll calls so far (any thread): a post that sees no change since the
  // previous one follows it back to back.
  std::uint64_t polls() const { return polls_.load(std::memory_order_relaxed); }

  // Drivers, normally the QPs that complete work here. AddDriver ignores a
  // driver already present. RemoveDriver returns once no thread is inside
  // that driver's turn any more; not from inside a driver.
  void AddDriver(PollDriver* driver);
  void RemoveDriver(PollDriver* driver);
  // One driver only (lock-free; PollDriver::WaitForInput is asked only then).
  bool single_driver() const { return driver_count_.load(std::memory_order_relaxed) == 1; }

  // Takes the queued entries of QP `qp_num` out (ibv_destroy_qp), keeping
  // the order of the others; returns how many went. Entries pushed later
  // are not affected: the caller makes sure the QP pushes no more first.
  std::size_t RemoveQp(std::uint32_t qp_num, QpEntries which);
  // How many successful entries of one QP are queued, not yet polled. The
  // connection manager holds a peer's disconnect back while there are any
  // (siwx_qp_unpolled_completions).
  std::size_t CountSuccessful(std::uint32_t qp_num) const;

  // ibv_req_notify_cq. kNone disarms. Arming tells every driver
  // (PollDriver::OnCqArmed), so progress held back for a polling
  // application resumes on the progress thread before it sleeps.
  void Arm(CqArm arm);

  std::uint32_t capacity() const { return capacity_; }
  std::size_t size() const { return count_.load(std::memory_order_acquire); }
  bool in_error() const { return in_error_.load(std::memory_order_acquire); }
  CqArm arm() const;
  // Lock-free look at the arm, for a post deciding whether it may wait for
  // a poll (Qp::CoalesceTx): an armed CQ's application sleeps instead.
  bool armed() const { return armed_.load(std::memory_order_relaxed); }

 private:
  CompletionQueue(std::uint32_t capacity, Callbacks callbacks);
  // PollWithProgress: sleeps until an entry is pushed (or the CQ fails), at
  // most the next wait's length (next_poll_wait(), or kPollWaitForDuePush
  // when `push_due` and that is longer); then sets the next wait's length.
  void WaitForPush(bool push_due);
  // The length WaitForPush would sleep for.
  std::chrono::microseconds PollWaitLength(bool push_due) const;
  // Back to the configured wait (activity on the CQ).
  void ResetPollWait();
  // Wakes the waiters if the ring holds anything (WakeDeferred).
  void WakeWaitersIfQueued();
  void WakeWaiters();
  // Poll: the drivers' owed transmits (NoteTxOwed).
  void FlushOwedTx();
  // PollWithProgress, after a poll that returned completions: the drivers'
  // awaited answers (NoteAnswerAwaited).
  void AwaitAnswers();

  const std::uint32_t capacity_;
  const std::uint64_t serial_;  // unique in the process, never 0 (PollWithProgress)
  const Callbacks callbacks_;

  mutable std::mutex mutex_;
  std::vector<WorkCompletion> ring_;  // guarded by mutex_; capacity_ entries
  std::uint32_t head_ = 0;            // guarded by mutex_; oldest entry
  CqArm arm_ = CqArm::kNone;          // guarded by mutex_
  std::atomic<bool> armed_{false};     // arm_ != kNone, written under mutex_
  std::atomic<std::size_t> count_{0};  // written under mutex_
  std::atomic<bool> in_error_{false};  // written under mutex_
  // PollWithProgress's bounded wait: waiters sleep on the futex word
  // `wake_seq_` and WakeWaiters bumps it and wakes them when the ring stops
  // being empty. Not a condition variable: a woken waiter took mutex_ again
  // on its way out, where the progress thread's next Push contended for it
  // (half of a Send receiver's futex calls; performance-notes 3.12).
  std::chrono::microseconds poll_wait_{0};
  // The next wait's length in microseconds (NextPollWait); written by the
  // polling threads only.
  std::atomic<std::int64_t> next_poll_wait_us_{0};
  std::atomic<std::uint32_t> wake_seq_{0};
  std::atomic<std::uint32_t> waiters_{0};  // raised under mutex_, lowered without
  // Set by WakeToHelp: ends a poll's wait, whose thread then helps.
  std::atomic<bool> help_wanted_{false};
  std::atomic<std::uint64_t> poll_waits_{0};
  std::atomic<std::uint64_t> waiter_wakes_{0};
  std::atomic<std::uint64_t> poll_wait_timeouts_{0};
  std::atomic<std::uint64_t> input_waits_{0};
  std::atomic<std::uint64_t> long_poll_waits_{0};

  // Held by the driving thread for the whole turn, so RemoveDriver waits for
  // it; polling threads only try it.
  std::mutex drivers_mutex_;
  std::vector<PollDriver*> drivers_;  // guarded by drivers_mutex_
  std::atomic<std::size_t> driver_count_{0};  // drivers_.size(), read without the mutex
  std::size_t next_driver_ = 0;       // guarded by drivers_mutex_; next to drive
  std::atomic<bool> tx_owed_{false};
  std::atomic<bool> answer_awaited_{false};  // NoteAnswerAwaited
  std::atomic<std::uint64_t> polls_{0};
};

}  // namespace siwx::engine
