// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The device context of the engine: the memory table (PDs and STags), the
// QP registry with its qp_num allocation, the async-event callback, and the
// progress thread.
//
// The progress thread blocks in epoll_wait on every bound QP's socket and on
// a Doorbell (eventfd); it busy-polls only while it answers a small-Read
// ping-pong itself (EngineConfig::responder_spin, responder_spin.h, 3.8):
// spinning engine threads destroy latency on a 2-vCPU host where the
// applications spin already (docs/performance-notes.md 3);
// EngineConfig::progress_spin opts into a short adaptive spin (3.3). It is
// the fallback for the QPs' own work, which application threads do when
// they can (qp.h, Threading): it does the receive processing when a socket
// is readable (so an RDMA Write target makes progress while its application
// does nothing), unless an application thread that polls one of the QP's
// CQs empty takes that turn itself (Qp::DriveFromPoll: a thread spinning in
// ibv_poll_cq needs no wake-up of this one; while it drives, its read lease
// keeps the socket's read interest off the poller), or one that polls its
// send CQ after a ping-pong post waits for the answer there (Qp::AwaitAnswer,
// EngineConfig::answer_spin, 3.26); a receive turn kicks
// the transmit side for the Read Responses it owes on its own thread (or
// leaves them to the gate's current owner). It continues transmitting when
// a socket becomes writable (application threads transmit inline from
// PostSend; the turns of several sockets found writable at once it shares
// with an application thread that polls a CQ empty, ShareTransmitTurns),
// and runs the commands application threads hand it (attach a stream,
// finalize a QP after an error or close, detach on destroy, flush
// receives, take over a transmit turn whose budget ran out).
//
// Ownership and ordering: `registry_mutex_` guards the QP map and the qp_num
// counter; the map holds a shared_ptr to every live QP, which keeps a QP
// alive while its socket is in the poller (the epoll cookie is the raw Qp
// pointer). A QP leaves the map in its detach command, which runs after the
// current batch of epoll events, so a cookie in a batch always names a live
// QP. `command_mutex_` guards the command list and the completed-ticket
// counter; commands run in submission order on the progress thread, and
// SubmitAndWait waits on `command_cv_` for its ticket (never when called on
// the progress thread itself, where it only submits).
//
// Time: the progress thread also runs QP timers (ScheduleTimer): the
// teardown bound, the responder's wait for the first FPDU and the first
// looks at a read lease (less often the longer it lasts, read_lease.h: each
// wake-up preempts a spinning application on a machine without a spare
// core). `timer_mutex_` guards the timer list; epoll_wait sleeps until the
// earliest one, and a timer earlier than that rings the doorbell. A timer
// only says "look at this QP at this time": the QP keeps its own deadlines
// and decides (Qp::OnTimer), so a stale timer does nothing. A lease still
// extended after those looks goes to the lease watch: an Alarm (timerfd) in
// the poller, due kMaxReadLeaseCheck after the earliest end among the
// watched leases, which the polls that extend them re-arm
// (PushLeaseWatch), so the progress thread wakes for a polled lease only
// once it lapses. `lease_watch_mutex_` guards the watched QPs; only the
// progress thread drops them (LookAtWatchedLeases, a detach), so a polling
// thread reads their lease ends without ever holding the last reference.
//
// Limits: one progress thread per Engine; Engine must outlive every use of
// its QPs. Destroying the Engine destroys the remaining QPs (no completions).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/engine/memory.h"
#include "common/engine/placement.h"
#include "common/engine/qp.h"
#include "common/engine/responder_spin.h"
#include "common/transport/tcp_stream.h"

namespace siwx::engine {

// How long a QP's stream may take from an error or a close (Disconnect, a
// Terminate sent or received, the peer's FIN) to being gone: what is still
// queued (the Terminate, the FIN) gets this long to leave and the peer this
// long to close; then the stream is reset (RST) and every WR flushed.
inline constexpr std::chrono::milliseconds kDefaultTeardownTimeout{10000};

// Longest progress_spin (SIWX_PROGRESS_SPIN_US).
inline constexpr std::chrono::microseconds kMaxProgressSpin{1000};

// How long a poll that returns the completion of a ping-pong post may read
// the stream for its answer (SIWX_ANSWER_SPIN_US; Qp::AwaitAnswer), and the
// most it may be set to.
inline constexpr std::chrono::microseconds kDefaultAnswerSpin{50};
inline constexpr std::chrono::microseconds kMaxAnswerSpin{1000};

// Posts made back to back (no poll of the QP's CQs in between) are sent
// together, in one sendmsg, up to this many payload octets
// (SIWX_TX_COALESCE_KIB; Qp::PostSendList, docs/performance-notes.md 3.13).
inline constexpr std::size_t kDefaultTxCoalesceOctets = std::size_t{1} << 20;
inline constexpr std::size_t kMaxTxCoalesceOctets = std::size_t{16} << 20;

// Many streams that all wait for their peers (sockets found full) share
// this many octets of data written but not yet sent, each its equal part
// rounded down to a power of two, never below kMinUnsentLimit; a stream
// that waits alone has no limit (TCP_NOTSENT_LOWAT, the kernel's default).
// With 64 QPs each socket held 4 MiB unsent, 240 MiB in all: the octets
// went cold in memory before the receiver copied them, and every window
// update of the one receiving thread transmitted a queue of the sender's
// in that thread (docs/performance-notes.md 3.14).
inline constexpr std::size_t kUnsentBudget = std::size_t{4} << 20;
inline constexpr std::size_t kMinUnsentLimit = std::size_t{64} << 10;
// The unsent limit of each socket while `blocked_streams` wait (0: none).
constexpr std::size_t UnsentLimitFor(std::size_t blocked_streams) {
  if (blocked_streams < 2) return 0;
  std::size_t limit = kUnsentBudget;
  for (std::size_t share = 1; share < blocked_streams && limit > kMinUnsentLimit; share *= 2) {
    limit /= 2;
  }
  return limit;
}

struct EngineConfig {
  MemoryTable::Options memory;
  AsyncEventCallback on_async_event;  // called on the thread that found the event
  std::chrono::milliseconds teardown_timeout = kDefaultTeardownTimeout;  // must be positive
  // Up to how long the progress thread polls without blocking after its
  // last event before it sleeps in epoll_wait (0: never, the default; at
  // most kMaxProgressSpin). Adaptive: spins that find nothing shorten it.
  std::chrono::microseconds progress_spin{0};
  // Whether the progress thread keeps off the CPU the application last
  // posted or polled from (placement.h; SIWX_PROGRESS_AFFINITY).
  ProgressAffinity progress_affinity = ProgressAffinity::kAway;
  // Without progress_spin: how long the progress thread polls before it
  // sleeps while it answers a Read ping-pong itself (responder_spin.h; 0:
  // never). Not a setting; tests lengthen it.
  std::chrono::microseconds responder_spin = ResponderSpin::kDefaultMax;
  // Up to how many payload octets of back-to-back posts wait for the next
  // poll, a larger post or a short timer instead of one sendmsg each (0:
  // every post transmits at once). Wire octets are the same either way.
  std::size_t tx_coalesce_octets = kDefaultTxCoalesceOctets;
  // Up to how long a poll of the send CQ that returns the completion of a
  // ping-pong post reads the QP's stream itself for the answer before it
  // returns (Qp::AwaitAnswer; 0: never). Adaptive: see there.
  std::chrono::microseconds answer_spin = kDefaultAnswerSpin;
};

enum class CreateQpStatus : std::uint8_t {
  kOk = 0,
  kInvalidConfig,  // null CQ, no PD, unsupported caps, SRQ not shared
  kNoResources,    // no qp_num left
};

class Engine {
 public:
  // nullptr if the poller or doorbell could not be created.
  static std::unique_ptr<Engine> Create(EngineConfig config = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  using TimerClock = std::chrono::steady_clock;

  MemoryTable& memory() { return memory_; }
  const MemoryTable& memory() const { return memory_; }

  // A new QP in RESET. qp_nums are unique among live QPs.
  std::shared_ptr<Qp> CreateQp(const QpConfig& config, CreateQpStatus* status = nullptr);
  std::shared_ptr<Qp> FindQp(std::uint32_t qp_num) const;
  std::size_t qp_count() const;

  // True on the progress thread.
  bool OnProgressThread() const;
  // A thread that polled a CQ of this engine empty (CompletionQueue::
  // PollWithProgress) takes transmit turns the progress thread is sharing
  // (ShareTransmitTurns), if any, until none is left. True if it took one.
  bool HelpTransmit();

  // The progress thread's kernel thread id (for sched_getaffinity; tests),
  // and a wake-up that makes it run its loop once (it re-reads the
  // placement hint before it sleeps again).
  pid_t progress_thread_tid() const { return progress_tid_.load(std::memory_order_acquire); }
  void WakeProgressThread() { doorbell_.Ring(); }

  // Application threads: placement hints (placement.h).
  void NoteApplicationCpu() { placement_.NoteApplicationCpu(); }
  void ClearApplicationCpu() { placement_.ClearApplicationCpu(); }

  // How often the responder spin (responder_spin.h) was armed, how many
  // waits of the progress thread its spins ended without sleeping, and how
  // many of those by reading the spin's target QP itself (tests).
  std::uint64_t responder_spin_arms() const {
    return responder_spin_arms_.load(std::memory_order_relaxed);
  }
  std::uint64_t responder_spin_catches() const {
    return responder_spin_catches_.load(std::memory_order_relaxed);
  }
  std::uint64_t responder_spin_reads() const {
    return responder_spin_reads_.load(std::memory_order_relaxed);
  }

  // Turns of the progress thread that found a timer due (RunTimers): its
  // wake-ups for timers, such as the looks at read leases (tests).
  std::uint64_t timer_turns() const { return timer_turns_.load(std::memory_order_relaxed); }
  // Transmit turns of sockets found writable that polling threads took
  // (HelpTransmit; tests).
  std::uint64_t transmit_turns_helped() const {
    return transmit_turns_helped_.load(std::memory_order_relaxed);
  }
  // Turns of the progress thread woken by the lease watch's alarm
  // (LookAtWatchedLeases; tests).
  std::uint64_t lease_watch_turns() const {
    return lease_watch_turns_.load(std::memory_order_relaxed);
  }

  // QPs whose socket is full (write interest armed), and the unsent limit
  // their sockets get (UnsentLimitFor).
  std::size_t tx_blocked_streams() const {
    return tx_blocked_streams_.load(std::memory_order_relaxed);
  }
  // The progress thread's epoll fd (tests read its entries in
  // /proc/self/fdinfo).
  int poller_fd() const { return poller_.fd(); }

 private:
  friend class Qp;

  enum class CommandKind : std::uint8_t { kAttach, kFinalize, kDetach, kFlushReceives, kKickTx };
  struct Command {
    CommandKind kind = CommandKind::kKickTx;
    std::shared_ptr<Qp> qp;
    std::uint32_t flags = 0;
  };

  explicit Engine(EngineConfig config);
  bool Start();
  void Run();
  void RunCommands();
  void Execute(const Command& command);
  // Queues a command for the progress thread; returns its ticket.
  std::uint64_t Submit(Command command);
  // Calls qp->OnTimer on the progress thread at `when` or soon after (any
  // thread; nothing happens if the QP is gone by then).
  void ScheduleTimer(const std::shared_ptr<Qp>& qp, TimerClock::time_point when);
  // epoll_wait's timeout until the earliest timer (-1: none).
  int TimerWaitMs();
  void RunTimers();
  // Progress thread (Qp::OnTimer): `qp`'s lease was still extended at the
  // looks' bound; the watch looks at it from now on.
  void WatchReadLease(const std::shared_ptr<Qp>& qp);
  // A polling thread that just extended a lease to beyond `now`
  // (Qp::ExtendReadLease): re-arms the watch's alarm once it comes within
  // half a bound (LeaseWatchRearmAfter); otherwise one relaxed load.
  void PushLeaseWatch(TimerClock::time_point now) {
    if (now.time_since_epoch().count() <
        lease_watch_rearm_after_.load(std::memory_order_relaxed)) {
      return;
    }
    std::lock_guard lock(lease_watch_mutex_);
    RearmLeaseWatchLocked(now);
  }
  // Arms the alarm for the watched leases' ends as they are now.
  void RearmLeaseWatchLocked(TimerClock::time_point now);
  // Progress thread: the alarm went off. Ends the watched leases that
  // lapsed, drops the QPs that hold none, re-arms.
  void LookAtWatchedLeases();
  // Progress thread, in `qp`'s detach.
  void ForgetWatchedLease(const Qp& qp);
  // Takes `qp` out of the watch; null if it was not in it.
  std::shared_ptr<Qp> UnwatchLocked(const Qp& qp);
  // Waits for poller events: epoll_wait, after the adaptive spin if
  // config_.progress_spin asks for one.
  int WaitForEvents(std::span<transport::Poller::Event> events);
  // WaitForEvents without progress_spin: the responder spin, then a sleep.
  int WaitAfterResponderSpin(std::span<transport::Poller::Event> events, int timeout_ms);
  // Epoll events taken per wait.
  static constexpr std::size_t kEventsPerWait = 64;
  // The transmit turns of the first `count` entries of shared_tx_ (sockets
  // this wake-up found writable, and nothing else of theirs, of QPs not
  // finalized): taken by this thread and by polling threads that help
  // (HelpTransmit), one of them woken for it if it sleeps in a poll. With many streams the one
  // progress thread was the sender of all of them, its CPU the limit while
  // the other stayed partly idle (docs/performance-notes.md 3.36).
  void ShareTransmitTurns(std::size_t count);
  // Claims the open share's turns until none is left, on the progress
  // thread or a helper; returns how many it took.
  std::uint64_t TakeSharedTurns();
  // The spin of both: polls without blocking for up to `budget`, yielding
  // the CPU between polls once `yield_after` has passed. Returns what a poll
  // found (0: nothing within the budget, or the engine is stopping);
  // `*at_once`: its first poll found it. With a `target`, most of its polls
  // read that QP's socket instead (Qp::ReadInResponderSpin), and
  // `*target_read` says that one of them read something (returning 0).
  int Spin(std::span<transport::Poller::Event> events, std::chrono::nanoseconds budget,
           std::chrono::nanoseconds yield_after, Qp* target, bool* at_once,
           bool* target_read);
  // In a spin with a target, every kPollsPerEventWait-th poll is an
  // epoll_wait for the other sockets, commands and timers.
  static constexpr unsigned kPollsPerEventWait = 8;
  // Tells CompletionQueue::NoteResponderSpin when the responder spin's
  // budget went from zero to some or back (pollers of this process then
  // wait longer between wake-ups: poll_wait_backoff.h).
  void NoteResponderSpin();
  // Qp, any thread: a Read Request of `size` octets was queued, the QP now
  // owing `outstanding` Responses; tells the responder spin when that
  // thread is the progress thread.
  void NoteReadRequestQueued(Qp& qp, std::uint32_t size, std::uint32_t outstanding) {
    if (!OnProgressThread()) return;
    responder_spin_.OnReadRequest(size, outstanding);
    spin_target_ = &qp;
  }
  std::chrono::milliseconds teardown_timeout() const { return config_.teardown_timeout; }
  std::size_t tx_coalesce_octets() const { return config_.tx_coalesce_octets; }
  std::chrono::nanoseconds answer_spin() const { return config_.answer_spin; }
  // Submits and waits until it ran, unless on the progress thread or the
  // engine is stopping (then it only submits).
  void SubmitAndWait(Command command);
  void Emit(const AsyncEvent& event) const;
  transport::Poller& poller() { return poller_; }
  void Unregister(std::uint32_t qp_num);

  const EngineConfig config_;
  MemoryTable memory_;
  transport::Poller poller_;
  transport::Doorbell doorbell_;

  mutable std::mutex registry_mutex_;
  std::unordered_map<std::uint32_t, std::shared_ptr<Qp>> qps_;  // guarded by registry_mutex_
  std::uint32_t next_qp_num_ = 1;                              // guarded by registry_mutex_

  std::mutex command_mutex_;
  std::condition_variable command_cv_;
  std::vector<Command> commands_;       // guarded by command_mutex_
  std::uint64_t submitted_ticket_ = 0;  // guarded by command_mutex_
  std::uint64_t completed_ticket_ = 0;  // guarded by command_mutex_
  bool stopping_ = false;               // guarded by command_mutex_
  std::thread::id thread_id_;           // written before the thread runs (under command_mutex_)

  using TimerMap = std::multimap<TimerClock::time_point, std::weak_ptr<Qp>>;
  std::mutex timer_mutex_;
  TimerMap timers_;  // guarded by timer_mutex_
  // Nodes of timers that went off, for ScheduleTimer to reuse: a posting
  // application thread schedules timers (a coalesced post's), and must not
  // allocate for it (a signal handler of the application's that allocates
  // would deadlock on the allocator's lock).
  std::vector<TimerMap::node_type> spare_timer_nodes_;  // guarded by timer_mutex_
  std::vector<std::shared_ptr<Qp>> due_timers_;  // RunTimers' (progress thread), kept for its capacity

  transport::Alarm lease_watch_alarm_;
  std::mutex lease_watch_mutex_;
  std::vector<std::shared_ptr<Qp>> watched_leases_;  // guarded by lease_watch_mutex_
  // What the alarm is armed for (max: disarmed; min: unknown).
  TimerClock::time_point lease_watch_due_ = TimerClock::time_point::max();  // guarded likewise
  // Written under lease_watch_mutex_; PushLeaseWatch reads it without.
  std::atomic<TimerClock::rep> lease_watch_rearm_after_{
      TimerClock::time_point::max().time_since_epoch().count()};
  std::atomic<std::uint64_t> lease_watch_turns_{0};

  // Progress thread only: the current spin budget (adaptive, <= progress_spin).
  std::chrono::nanoseconds spin_budget_{0};
  // Transmit turns shared with polling threads (ShareTransmitTurns,
  // HelpTransmit). The progress thread fills shared_tx_ and the count while
  // sharing is closed and no helper is inside; turns are claimed through
  // shared_tx_next_; it closes the sharing and waits for the helpers before
  // anything can detach a QP, so a shared Qp* stays valid for them.
  std::array<Qp*, kEventsPerWait> shared_tx_{};
  std::atomic<std::uint32_t> shared_tx_count_{0};
  std::atomic<std::uint32_t> shared_tx_next_{0};
  std::atomic<bool> shared_tx_open_{false};
  std::atomic<int> shared_tx_helpers_{0};
  std::atomic<std::uint64_t> transmit_turns_helped_{0};
  // Progress thread only: the spin while it answers Reads (responder_spin.h),
  // and whether the events of the current wake-up came soon after its wait
  // began (found by that spin, or after a brief sleep).
  ResponderSpin responder_spin_;
  ResponderSpin::Wake wake_ = ResponderSpin::Wake::kLate;
  // The QP whose Read Request the progress thread queued last: the
  // responder spin reads its socket itself (Spin). Progress thread
  // only; cleared by that QP's detach, before the registry lets it go.
  Qp* spin_target_ = nullptr;
  bool spin_noted_ = false;  // what NoteResponderSpin last told the CQs
  std::atomic<std::uint64_t> responder_spin_arms_{0};
  std::atomic<std::uint64_t> responder_spin_catches_{0};
  std::atomic<std::uint64_t> responder_spin_reads_{0};
  std::atomic<std::uint64_t> timer_turns_{0};
  // Qp::SetTxBlocked.
  std::atomic<std::size_t> tx_blocked_streams_{0};
  // Notes from application threads; the rest is the progress thread's.
  ProgressPlacement placement_;
  std::atomic<pid_t> progress_tid_{0};

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace siwx::engine
