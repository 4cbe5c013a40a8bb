// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// An iWARP queue pair: the RDMAP/DDP semantics of one RDMAP Stream (RFC 5040,
// RFC 5041) over one MPA/TCP connection (RFC 5044), with direct placement.
//
// A Qp owns its send queue (SQ), its receive queue (or uses a shared one),
// the outbound RDMA Read Request queue (ORQ, depth ORD) and the inbound one
// (IRQ, depth IRD), the MSN counters of the three untagged queues, and the
// bound TCP stream. Engine::CreateQp makes one; Bind attaches a connected
// stream and moves it to RTS; PostSend/PostRecv queue work; Modify, Query,
// Disconnect and Destroy manage it.
//
// Semantics (RFC 5040 5.5 ordering and completion rules):
//  - Messages go out in SQ order; Read Responses are produced in the order
//    the Read Requests arrived and interleave with SQ messages at message
//    boundaries only (never inside a message).
//  - SQ completions are delivered in WR order: a Send or Write completes
//    locally once TCP has accepted all of it, a Read when the last octet of
//    its Read Response has been placed, and anything posted after a Read
//    completes after it. A fenced WR does not start until every earlier Read
//    has completed; a Read does not start while ORD Reads are outstanding.
//  - Inbound messages are processed in stream order, so a Read Request sees
//    every Write and Send that arrived before it.
//  - Receive completions are delivered in MSN order.
//  - Every protocol error ends the stream: the Terminate (RFC 5040 4.8, 7)
//    is the last message we send, then FIN; the QP goes to Error and every
//    outstanding WR completes, the failing one with its specific status and
//    the rest with WrFlushErr.
//  - Teardown is bounded: from the moment a stream starts ending (a
//    Terminate to send or received, Disconnect, the peer's FIN) it has the
//    engine's teardown timeout (EngineConfig) to get its Terminate or FIN
//    out and to see the peer close; then it is reset (RST), the QP goes to
//    Error and every WR is flushed. So a peer that stops reading, or
//    vanishes, never pins a QP.
//
// Threading. Two kinds of threads touch a QP, and which one runs a piece of
// work is decided by two locks, not by the thread:
//  - application threads: posts, Modify, Query, Bind, Disconnect, Destroy;
//    and, when they can take it, the QP's transmit and receive work
//    (run-to-completion, so a busy-polling application needs no second
//    runnable thread): PostSend transmits inline (unless the socket is
//    known full while other streams of the engine wait too: then EPOLLOUT
//    does; or the progress thread pumps the stream of a QP alone on its
//    send CQ: then the next poll does, KickTxFromApplication), polling either CQ
//    empty gives the QP a receive turn (DriveFromPoll), and a poll of the
//    send CQ that returns the completion of a ping-pong post reads until
//    its answer came in (AwaitAnswer); a receive turn that
//    owes Read Responses, or opened an ORD slot, transmits on its own
//    thread too;
//  - the engine's progress thread: the commands below (attach, finalize,
//    detach, flush, a transmit turn whose budget ran out), the timers, and
//    the fallback for all of the above: it blocks in epoll_wait and
//    receives when the socket is readable, and transmits when it is
//    writable, for applications that do not poll (the passive side of
//    ib_write_bw) or that sleep in a blocking wait.
// The transmit side (QpTx) runs in whichever thread owns the transmit gate
// (`tx_gate_`); the receive side (QpRx) in whichever holds `rx_mutex_`,
// which the progress thread takes and application threads only try.
// The transmit gate (`tx_gate_`) is a counter: the thread that moves it from
// 0 owns the transmit side and runs QpTx::Pump until no kick is left; a
// thread that finds it non-zero only adds its kick and returns, and the
// owner pumps once more for it. So posting never blocks on another thread,
// and no kick is lost. Anything that needs the transmit side quiescent
// (attach, finalize, detach) takes the gate exclusively on the progress
// thread, waiting (yield) for an inline owner to finish its bounded pump.
//
// QpRx and QpTx reach the QP only through QpForRx and QpForTx (qp_sides.h),
// whose calls say which of the locks below they take.
//
// Locks and what they guard (each field below repeats it):
//  - queue_mutex_: the SQ ring and its cursors, ORQ, IRQ, the IRD count, the
//    flush flags, the stream parameters. Held briefly; never while calling
//    out (CQ pushes, callbacks) and never while doing I/O.
//  - info_mutex_: error bookkeeping (first error wins) and the Terminate
//    causes sent and received.
//  - poll_mutex_: this QP's epoll registration and interest mask.
//  - completion order: SQ completions are pushed by whichever thread owns
//    the completion gate (`sq_cq_gate_`, same counter scheme), so they reach
//    the CQ in WR order even when transmit and receive both complete WRs.
//    Receive completions are pushed by the rx_mutex_ holder only.
// Lock order: none is held while taking another, except info_mutex_ ->
// queue_mutex_ (error bookkeeping marks the failing WR) and rx_mutex_ ->
// any of the others and the transmit gate.
//
// Callbacks (CQ notifications, SRQ limit, async events) run without any of
// these locks except rx_mutex_ (for what the receive side completes),
// possibly on an application thread inside PostSend or PollWithProgress.
// They may post, poll and re-arm; Destroy from inside one does not wait.
//
// Not validated here: that the stream parameters match what MPA negotiated
// (the CM's job), and the content of buffers (the CRC is computed when an
// FPDU is framed: an application that changes a buffer of an outstanding WR
// gets a CRC error at the peer, as verbs leaves such changes undefined; the
// source of an RDMA Read, which no WR protects, is copied first, tx.h).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/engine/completion.h"
#include "common/engine/memory.h"
#include "common/engine/qp_sides.h"
#include "common/engine/qp_state.h"
#include "common/engine/read_lease.h"
#include "common/engine/receive_queue.h"
#include "common/engine/rx.h"
#include "common/engine/stream_params.h"
#include "common/engine/tx.h"
#include "common/engine/work_request.h"
#include "common/stats/stats_file.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/terminate.h"

namespace siwx::engine {

class Engine;

struct AsyncEvent {
  AsyncEventType type = AsyncEventType::kQpFatal;
  std::uint32_t qp_num = 0;
};
using AsyncEventCallback = std::function<void(const AsyncEvent&)>;

// The async event for an error found on inbound traffic: protection errors
// (DDP tagged, RDMAP Remote Protection) are access errors, other DDP and
// RDMAP Remote Operation errors are request errors, LLP and catastrophic
// errors are fatal.
AsyncEventType EventForCause(const rdmap::TerminateCause& cause);
// The status of our WR that the peer's Terminate names (by its header copy).
WcStatus StatusForPeerCause(const rdmap::TerminateCause& cause);

// Largest message a WR may move (ibv max_msg_sz); more is a LocLenErr.
inline constexpr std::uint64_t kMaxMessageSize = std::uint64_t{1} << 31;
// Largest IRD/ORD a QP accepts by default (Linux siw's limit).
inline constexpr std::uint32_t kDefaultMaxReadDepth = 128;

struct QpConfig {
  PdId pd = kNoPd;
  CompletionQueue* send_cq = nullptr;  // must outlive the QP's Destroy
  CompletionQueue* recv_cq = nullptr;  // must outlive the QP's Destroy
  ReceiveQueue* srq = nullptr;         // shared receive queue, or null for an own RQ
  QueueCaps sq_caps;
  QueueCaps rq_caps;                   // ignored when srq is set
  bool sq_sig_all = false;             // every successful send WR completes
  std::uint32_t max_ird = kDefaultMaxReadDepth;  // Bind refuses larger params.ird
  std::uint32_t max_ord = kDefaultMaxReadDepth;  // Bind refuses larger params.ord
};

enum class BindStatus : std::uint8_t {
  kOk = 0,
  kInvalidState,   // not INIT or RTR, or destroyed
  kInvalidStream,  // null stream
  kInvalidParams,  // IRD/ORD above the QP's limits, max ULPDU too small
};

// Counters for tests and diagnostics; monotonic, read with relaxed loads.
struct QpCounters {
  std::uint64_t tx_fpdus = 0;
  std::uint64_t tx_octets = 0;       // wire octets written
  std::uint64_t tx_syscalls = 0;     // sendmsg calls that moved data
  std::uint64_t tx_would_block = 0;  // sendmsg calls that found the socket full
  std::uint64_t rx_fpdus = 0;
  std::uint64_t rx_octets = 0;       // wire octets read
  std::uint64_t rx_syscalls = 0;     // recvmsg calls that returned data
  std::uint64_t rx_staged_payload = 0;  // payload octets copied from the staging buffer
  std::uint64_t rx_direct_payload = 0;  // payload octets received straight into targets
};

struct QpAttributes {
  std::uint32_t qp_num = 0;
  QpState state = QpState::kReset;
  PdId pd = kNoPd;
  QueueCaps sq_caps;
  QueueCaps rq_caps;
  bool has_srq = false;
  bool sq_sig_all = false;
  bool bound = false;
  StreamParams params;         // valid when bound
  std::size_t max_ulpdu = 0;   // what we send; valid when bound
  // The Terminate we sent, and the one the peer sent (RFC 5040 4.8).
  std::optional<rdmap::TerminateHeader> terminate_sent;
  std::optional<rdmap::TerminateHeader> terminate_received;
  // Why the stream failed when no Terminate could say it (connection lost,
  // MPA error after which we still sent one, local catastrophe): the LLP or
  // local cause, first one only.
  std::optional<rdmap::TerminateCause> local_error;
  std::uint32_t sq_outstanding = 0;  // posted send WRs not yet completed
};

// QpForRx and QpForTx (qp_sides.h) are what its receive and transmit sides
// may do to it; they reach nothing else of it.
class Qp final : public std::enable_shared_from_this<Qp>,
                 private PollDriver,
                 private QpForRx,
                 private QpForTx {
 public:
  ~Qp() override;
  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;

  std::uint32_t qp_num() const override { return qp_num_; }
  const QpConfig& config() const { return config_; }
  QpState state() const override { return state_.state(); }

  // ibv_post_send for one WR / a list (stops at the first failure; *posted
  // says how many were taken). Transmits inline when the transmit side is
  // idle; otherwise the current owner or the progress thread sends it.
  PostStatus PostSend(const SendWorkRequest& wr);
  PostStatus PostSend(std::span<const SendWorkRequest> wrs, std::size_t* posted);
  // ibv_wr_complete: every WR of `wrs` or none (the status of the first WR
  // that would fail, or kQueueFull when the SQ lacks room for all of them).
  PostStatus PostSendAll(std::span<const SendWorkRequest> wrs);
  // ibv_post_recv; kInvalidState when the QP uses an SRQ (post there).
  PostStatus PostRecv(const ReceiveWorkRequest& wr);

  // Out-of-band connect (docs/out-of-band-connect.md): the application
  // asked for RTS while the stream is still being set up. From now on send
  // WRs posted in RTR are queued instead of refused; Bind starts them, in
  // order, ahead of anything posted later; an error before that flushes them.
  void QueueSendsBeforeStream() { queue_sends_before_stream_.store(true); }
  // Out-of-band connect: end the stream as an InfiniBand RC QP ends, which
  // is what programs that connect QPs themselves expect: the peer's
  // orderly close leaves the posted receives outstanding instead of
  // flushing them (a peer that destroys its QP does not flush ours on
  // InfiniBand); they flush on a later ibv_modify_qp to ERR or post_recv.
  // Sends are held too (SetIbRetryTimeout). Cleared at RESET.
  void UseIbTeardown() { ib_teardown_.store(true); }
  // Out-of-band connect: the InfiniBand transport timeout of ibv_modify_qp
  // (IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT): how long an RC sender retries
  // before it gives up, 4.096 us x 2^timeout x (retry_cnt + 1); zero is
  // InfiniBand's timeout 0, retry for ever. After the peer's orderly close
  // (UseIbTeardown) the send WRs still outstanding, and those posted
  // later, are held as an InfiniBand sender holds WRs that a destroyed
  // peer QP never acknowledges: once the oldest has waited this long it
  // completes with RetryExcErr and the rest flush; a modify to ERR flushes
  // them at once. Without this a ping-pong that posts one more Send than it
  // needs (ibv_srq_pingpong -q 4) got that Send's flush in the same poll as
  // its last message, and failed.
  void SetIbRetryTimeout(std::chrono::nanoseconds timeout) {
    ib_retry_timeout_ns_.store(timeout.count(), std::memory_order_relaxed);
  }

  // ibv_modify_qp(IBV_QP_STATE). Entering ERR aborts the stream (RST) and
  // flushes every WR; RESET discards them; SQD is Disconnect.
  QpStatus Modify(QpState target, std::optional<QpState> expected_current = std::nullopt);

  // Attaches a connected, non-blocking stream and its negotiated parameters
  // and moves INIT/RTR to RTS (QpEvent::kConnectionEstablished).
  BindStatus Bind(std::unique_ptr<transport::TcpStream> stream, const StreamParams& params);

  // Orderly close (RTS -> SQD): the WRs posted before it and the Read
  // Responses owed are sent, then FIN; the QP goes to ERR and what remains
  // (Reads still waiting for responses, WRs posted later) is flushed. False
  // if the QP is not in RTS.
  bool Disconnect();

  // Detaches the stream and removes the QP from the engine. A stream still
  // connected or ending in order is closed gracefully, as Linux siw closes
  // it: what TCP holds still reaches the peer, then FIN; WRs not yet
  // started are dropped. A stream an error ended is reset (RST).
  // No completions are generated. Safe while the progress thread is
  // running; when it returns (off the progress thread and outside callbacks
  // of this QP) no engine thread touches the QP's buffers or CQs any more.
  void Destroy();

  QpAttributes Query() const;
  QpCounters Counters() const;

  // Lets the caller (e.g. poll_cq) give the transmit side a turn.
  void ProgressSend() { KickTx(); }

  // A turn of this QP's work on the calling application thread, called by
  // either of its CQs when polled empty (PollWithProgress), so that a
  // busy-polling application completes its own work without waiting for
  // the progress thread to be scheduled:
  //  - receive CQ with a receive posted: the receive side reads what the
  //    socket holds (an inbound Send can complete);
  //  - send CQ with a Read outstanding: the same (its Read Response).
  // Otherwise an empty poll costs no system call. The turn only tries
  // rx_mutex_, so nothing is processed twice; it does nothing on the
  // progress thread, inside a receive turn (callbacks), or outside RTS.
  // Transmit needs no turn here: PostSend transmits inline, and a socket
  // that was full is the progress thread's (EPOLLOUT).
  // A receive turn from a poll that read nothing keeps this QP's polls from
  // reading again for kEmptyPollBackoff: a spinning application otherwise
  // makes one recvmsg (EAGAIN) per empty poll. Counted from the end of that
  // read; short against the 8 B latency it can add (performance-notes 3.4).
  // With a CQ that may wait (CompletionQueue::set_poll_wait), a receive
  // turn is not taken once no read found data for kQuietBeforePollWait, or
  // kSinkOctets came in since the last PostSend or between the last two, or
  // 2 x kSinkOctets over the last three (a bulk receiver that sends
  // little, now and then two posts at once): the read lease ends, the progress
  // thread reads, and the poll may sleep (PollMayWait) until that thread
  // pushes what completes. Except a sink that is the only driver of the
  // polled receive CQ: it reads its own stream and sleeps on its socket
  // when it is empty, as a bulk Read requester alone on its send CQ does
  // (WaitForInput).
  void DriveFromPoll(const CompletionQueue& polled) override;
  // The progress thread's responder spin (Engine::Spin): reads the socket
  // as OnPollEvent does for EPOLLIN, unless an application thread reads it
  // (a read lease) or is in a receive turn. True if a read returned octets.
  bool ReadInResponderSpin();
  void OnCqArmed(const CompletionQueue& cq) override;
  // True when nothing the polling thread could do would complete anything
  // of ours on either CQ: the receive side has nothing to complete (no
  // receive posted, no Read outstanding) or its stream is quiet (see
  // DriveFromPoll; the lease ends so the progress thread reads), and the
  // transmit side has nothing outstanding or waits for a full socket to
  // drain (write interest armed: the progress thread's EPOLLOUT moves it).
  // A latency test's socket is never full, nor quiet for 10 ms,
  // nor a sink (it sends a message per message received), so its polls
  // never wait.
  bool PollMayWait(const CompletionQueue& polled) override;
  // Transmits the posts PostSendList left for the next poll.
  void FlushOwedTx() override;
  // Back-to-back posts (no poll of either CQ since the previous post, and
  // nothing received since: not an answer) leave their transmit to the
  // next poll of either CQ, to ibv_req_notify_cq, to a post that brings the
  // waiting octets to EngineConfig::tx_coalesce_octets, or at the latest to
  // a timer of kTxCoalesceDelay on the progress thread; the first post after
  // a poll transmits at once. One sendmsg then carries many WRs: on loopback a
  // 64 KiB write per sendmsg reached about a third of what 1 MiB writes
  // do (docs/performance-notes.md 3.13).
  static constexpr std::chrono::milliseconds kTxCoalesceDelay{1};
  // The unsent limit (TCP_NOTSENT_LOWAT) set on the socket when it was last
  // found full, from the streams of the engine that waited then
  // (UnsentLimitFor; 0: the system's default). Tests.
  std::size_t unsent_limit() const { return unsent_limit_.load(std::memory_order_relaxed); }
  // EPOLLOUT wake-ups that found the transmit side owned by another thread
  // (each takes the write interest off; tests).
  std::uint64_t tx_wakes_owned() const {
    return tx_wakes_owned_.load(std::memory_order_relaxed);
  }
  // Posts and flushes that left their transmit to EPOLLOUT because the
  // socket was known full (KickTxFromApplication; tests).
  std::uint64_t tx_kicks_left_to_epollout() const {
    return tx_kicks_left_to_epollout_.load(std::memory_order_relaxed);
  }
  // Posts and flushes whose kick found the transmit gate held by another
  // thread (the progress thread on EPOLLOUT, say), which pumps for them
  // (KickTxFromApplication; tests).
  std::uint64_t tx_kicks_to_owner() const {
    return tx_kicks_to_owner_.load(std::memory_order_relaxed);
  }
  // Posts and flushes that found the progress thread pumping this stream
  // and left their transmit to the next poll (KickTxFromApplication; tests).
  std::uint64_t tx_kicks_left_to_poll() const {
    return tx_kicks_left_to_poll_.load(std::memory_order_relaxed);
  }
  // Tests: hold the transmit gate as an application thread transmitting
  // inline does; kicks that arrive meanwhile pump at the release.
  void HoldTxGateForTest() { LockTxExclusive(); }
  void ReleaseTxGateForTest() { UnlockTxExclusive(); }
  // Tests: called on the progress thread after each pump of a transmit
  // turn it owns (the gate held); the caller keeps `hook` alive until it
  // sets nullptr again.
  void SetProgressPumpHookForTest(const std::function<void()>* hook) {
    progress_pump_hook_.store(hook, std::memory_order_release);
  }
  // Posts whose transmit waited for one of the above (tests).
  std::uint64_t coalesced_posts() const {
    return coalesced_posts_.load(std::memory_order_relaxed);
  }
  // A push is under way: the socket is full with WRs of ours in the SQ (the
  // progress thread's EPOLLOUT sends and completes them), or the QP is a
  // sink whose stream the progress thread reads (StreamLeftToProgress).
  bool PollPushDue() override;
  // The poller reads the stream itself and sleeps in poll(2) on the socket
  // when it is empty (at most half a lease), instead of the progress thread
  // reading and waking it per push (docs/performance-notes.md 3.16), or of
  // spinning on an empty socket (3.39), when it holds the read lease and
  // the polled CQ has no other driver, for
  //  - a sink polled on its receive CQ, with receives posted;
  //  - a bulk Read requester polled on its send CQ: kBulkReads or more
  //    Reads outstanding, nothing this thread could send (the pump stopped
  //    idle since the last post, no Read Response owed, the socket not
  //    full), so only their responses can complete anything, and no input
  //    for kInputGapBeforeWait. A Read ping-pong (one outstanding) spins as
  //    before: a wake-up costs it more than the answer takes.
  bool WaitForInput(const CompletionQueue& polled, std::chrono::nanoseconds max) override;
  // Engine::HelpTransmit of this QP's engine.
  bool HelpTransmit() override;
  // The answer spin (EngineConfig::answer_spin). A ping-pong post (alone in
  // the SQ, after something came in) on a QP whose stream no CQ poll reads
  // (no read lease: no receive or Read outstanding, so its application
  // waits for the answer outside verbs, spinning on memory as ib_write_lat
  // does) arms it. The next poll of the send CQ that returns completions
  // then reads the stream itself, read interest off the progress thread's
  // poller, until something comes in or the spin's budget runs out, and
  // only then returns: the answer is placed by the thread that waits for it
  // instead of by a progress thread woken per message (a wake-up across CPUs
  // cost 8 us on one 2-vCPU VM; docs/performance-notes.md 3.26).
  // Adaptive: a spin that ends with nothing halves the next; the full budget
  // comes back when ping-pong posts follow each other within twice it (and
  // the QP's first ping-pong post has it).
  void AwaitAnswer(const CompletionQueue& polled) override;
  // Spins taken, and those that ended with something received (tests).
  std::uint64_t answer_spins() const { return answer_spins_.load(std::memory_order_relaxed); }
  std::uint64_t answers_caught() const {
    return answers_caught_.load(std::memory_order_relaxed);
  }
  // kSinkOctets came in since the last post, or the post rules of
  // PostSendList keep the QP a sink (StreamLeftToProgress, PollPushDue).
  bool IsSink() const;
  // WaitForInput's rule (see there).
  bool ReadsOwnInput(const CompletionQueue& polled);
  static constexpr std::size_t kBulkReads = 2;
  // A bulk Read requester sleeps on its socket only once its polls read
  // nothing for this long: about two wake-ups across CPUs (8 us on a
  // 2-vCPU VM, docs/performance-notes.md 3.26), which a stream that comes
  // in faster would pay per arrival, on the sender's CPU (3.39).
  static constexpr std::chrono::microseconds kInputGapBeforeWait{15};
  // The socket is full with WRs of ours in the send queue: the progress
  // thread's EPOLLOUT will send them and push their completions.
  bool FullSocketHoldsOwnWrs();
  // Long against a connection's setup: perftest exchanges its keys over a
  // QP, then the client connects again at once while the server re-listens;
  // with 1 ms the server's first poll slept through the quiet start, woke
  // a few tens of us later and 3 of 25 connects were refused
  // (docs/performance-notes.md 3.6). Short against a latency test: with
  // 100 ms perftest's ib_read_lat server spun on its idle key-exchange CQ
  // for all of a 5,000-iteration run, a third spinner on 2 vCPUs
  // (performance-notes 3.11).
  static constexpr std::chrono::milliseconds kQuietBeforePollWait{10};
  static constexpr std::uint64_t kSinkOctets = 4u << 20;
  static constexpr std::chrono::nanoseconds kEmptyPollBackoff{1000};
  // Until when polls take no receive turn (steady_clock ticks), and how many
  // receive turns DriveFromPoll took (for tests: each may be a recvmsg).
  std::chrono::steady_clock::rep poll_idle_until() const {
    return poll_idle_until_.load(std::memory_order_relaxed);
  }
  std::uint64_t poll_receive_turns() const {
    return poll_receive_turns_.load(std::memory_order_relaxed);
  }
  // How often the progress thread looked at a read lease (for tests: each
  // look is a wake-up, CheckReadLease and the engine's lease watch), and how
  // many leases were taken.
  std::uint64_t read_lease_looks() const {
    return read_lease_looks_.load(std::memory_order_relaxed);
  }
  std::uint64_t read_leases_taken() const {
    return read_leases_taken_.load(std::memory_order_relaxed);
  }
  // Whether the engine's lease watch looks at this QP's lease (tests).
  bool read_lease_watched() const;

 private:
  friend class Engine;

  // PostSend and PostSendAll: queues a prefix of `wrs`, or with
  // all_or_nothing all of them or none.
  PostStatus PostSendList(std::span<const SendWorkRequest> wrs, std::size_t* posted,
                          bool all_or_nothing);
  // Whether the transmit of `posted` (just queued, queue_mutex_ held) waits
  // for what follows: see kTxCoalesceDelay.
  // `answer`: something came in since the previous post.
  bool CoalesceTx(std::span<const SendWorkRequest> posted, bool answer);

  // One send WR from post to completion. Fields are written under
  // queue_mutex_ (the WR record only at post time).
  struct SqEntry {
    bool signaled = false;
    bool done = false;             // completed; waiting for the head to reach it
    bool flush_only = false;       // posted in Closing/Terminate/Error: never started
    // The status it gets when flushed: WrFlushErr, or the specific error a
    // Terminate named it with while the transmit side may still be using it.
    WcStatus flush_status = WcStatus::kWrFlushErr;
    WcStatus status = WcStatus::kSuccess;
    std::uint32_t msn = 0;         // QN 0 (Send) or QN 1 (Read) MSN it went out with
    SendRecord wr;                 // last: its SGEs follow it in the ring slot
  };

  // Bounded ring of SqEntry addressed by a 64-bit sequence number. A slot
  // holds the entry and max_sge SGEs; inline data longer than that lives in
  // `inline_area` (max_inline_data octets per slot), made at the first such
  // post, so QPs that never post it do not pay for it.
  struct SendRing {
    RecordSlots<SqEntry> slots;
    std::unique_ptr<std::uint8_t[]> inline_area;
    std::uint64_t head = 0;  // oldest not yet retired (completion order)
    std::uint64_t tail = 0;  // next to post
    SqEntry& At(std::uint64_t seq) { return slots[seq % slots.size()]; }
    std::uint64_t size() const { return tail - head; }
  };
  // Stores `wr` in the SQ slot of `seq` (queue_mutex_ held) and returns
  // that entry; nullptr if the inline area could not be allocated.
  SqEntry* StoreSendRecord(std::uint64_t seq, const SendWorkRequest& wr);

  // Finalization work the progress thread owes this QP (bit set).
  enum FinalizeFlags : std::uint32_t {
    kFinalizeNone = 0,
    kFinalizeAbort = 1u << 0,    // close with RST
    kFinalizeDiscard = 1u << 1,  // RESET: drop WRs without completions
  };

  Qp(Engine* engine, std::uint32_t qp_num, const QpConfig& config,
     std::unique_ptr<ReceiveQueue> own_rq);

  // ---- QpForSide, QpForRx, QpForTx (qp_sides.h says what each does) ----
  MemoryTable& memory() override;
  PdId pd() const override { return config_.pd; }
  stats::QpCounterBlock& counters() override { return counters_; }
  bool RtrReceived() const override;
  void EndStream(bool abort) override;
  std::optional<ReceiveWorkRequest> TakeReceive() override;
  void CompleteReceive(const WorkCompletion& wc, bool solicited) override;
  std::optional<OrqEntry> OldestRead() override;
  void CompleteOldestRead(const OrqEntry& read) override;
  std::uint32_t ReadRequestsOutstanding() override;
  void QueueReadRequest(const IrqEntry& request) override;
  std::optional<std::uint64_t> FindReadByMsn(std::uint32_t msn) override;
  std::optional<std::uint64_t> FindUnfinishedSendByMsn(std::uint32_t msn) override;
  std::optional<std::uint64_t> FindUnfinishedWriteByStag(std::uint32_t stag) override;
  void MarkRtrReceived() override;
  void OnPeerClosedInOrder() override;
  bool finalized() const override { return finalized_; }
  transport::TcpStream* stream() override;
  std::optional<TxMail> TakeMail() override;
  std::uint64_t SqHead() override;
  SqPeek PeekSq(std::uint64_t seq) override;
  void SetSqMsn(std::uint64_t seq, std::uint32_t msn) override;
  void MarkSqDone(std::uint64_t seq) override;
  void PushOrq(const OrqEntry& read) override;
  std::optional<IrqEntry> TakeReadRequest() override;
  void ResponsesSent(std::uint32_t count) override;
  void BeginSendAccounting() override;
  void EndSendAccounting() override;

  // ---- Transmit gate ----
  void KickTx() override;
  // KickTx for a post or a poll's flush: leaves the pump to EPOLLOUT while
  // the socket is known full and other streams wait too, and to the next
  // poll while the progress thread pumps this stream (LeaveTxToNextPoll).
  void KickTxFromApplication();
  // Either CQ is armed (ibv_req_notify_cq): the application will sleep on
  // its completion channel rather than poll again.
  bool SleepsOnACompletionChannel() const {
    return config_.send_cq->armed() || config_.recv_cq->armed();
  }
  // Marks a transmit owed to the next poll of either CQ (FlushOwedTx), with
  // the kTxCoalesceDelay timer for an application that does not poll again.
  void LeaveTxToNextPoll();
  void RunTx(std::uint32_t seen);
  void LockTxExclusive();  // progress thread only
  void UnlockTxExclusive();

  // Waits (yielding) while the transmit side is between a sendmsg and the
  // accounting of what it took, so the IRD count read afterwards includes
  // every response the peer can have received. Bounded: the holder is in a
  // non-blocking sendmsg and its bookkeeping, never in a callback.
  void WaitForSendAccounting() const override;

  // ---- Completions ----
  // Pushes the completions of finished SQ entries at the head, in order.
  void RetireSq() override;
  // Marks every unfinished SQ entry done with WrFlushErr (queue_mutex_ held).
  void FlushSqLocked();
  // The oldest send WR not yet done (queue_mutex_ held).
  std::optional<std::uint64_t> OldestUnfinishedLocked();
  // Held sends (SetIbRetryTimeout): starts the clock of the oldest held WR
  // if none runs; returns the deadline to schedule a timer for.
  std::optional<std::chrono::steady_clock::time_point> StartHeldSendClockLocked();
  // Ends the hold: with `due`, only once the deadline has passed, the oldest
  // WR completing with RetryExcErr; without, at once (modify to ERR). The
  // rest flush.
  void ReleaseHeldSends(std::optional<std::chrono::steady_clock::time_point> due);
  void PushRecvCompletion(const WorkCompletion& wc, bool solicited);
  // Counts an unsuccessful completion in the stats slot.
  void CountCompletion(WcStatus status);

  // ---- State ----
  // How a transition's actions are carried out, beyond what the table says.
  struct TransitionEffects {
    // kQpActionCloseLlp: the transmit side sends this Terminate last, then
    // FIN; without one it winds down as `close` says.
    std::optional<rdmap::TerminateHeader> terminate;
    TxClose close = TxClose::kGraceful;
    // Flush/Discard: wait for the progress thread's finalization (unless
    // inside an engine turn, where that could deadlock), or only ask for it.
    bool wait_for_finalize = false;
    // The caller is the finalization (the flush itself): nothing to ask for.
    bool finalizing = false;
    // Carried out even when the event changed nothing: an error path ends
    // the stream it found whatever state a racing Modify or close left.
    std::uint32_t always = kQpActionNone;
  };
  // Moves the state by `event` and carries out the transition's actions.
  TransitionResult Transition(QpEvent event, const TransitionEffects& effects);
  TransitionResult Transition(QpEvent event) { return Transition(event, TransitionEffects()); }
  // The one place that carries out a transition's actions (qp_state.h):
  //  - kQpActionCloseLlp: the mailbox tells the transmit side how to wind
  //    down (queue_mutex_), the teardown bound starts, the transmit side
  //    gets a turn;
  //  - kQpActionFlushQueues / kQpActionDiscardQueues: the progress thread
  //    finalizes the QP (Finalize), with RST for kQpActionAbortLlp.
  // Any thread; the caller holds no lock.
  void ApplyTransition(const TransitionResult& t, const TransitionEffects& effects);

  // ---- Errors ----
  // First error wins: records it, moves the state, hands the Terminate (if
  // any) to the transmit side, marks the failing WR, fires the event and
  // schedules finalization. Returns false if an error was already raised.
  // Any thread; the caller holds no lock.
  bool RaiseError(const ErrorReport& report) override;
  void RecordTerminateReceived(const rdmap::TerminateHeader& header) override;
  // The transmit side is done (Terminate or FIN written, or it gave up):
  // ask the progress thread to finalize.
  void RequestFinalize(std::uint32_t flags);
  // Starts the teardown bound for the current stream (first call only; any
  // thread): at its end OnTimer resets the stream.
  void ArmTeardown();

  // ---- Progress thread ----
  void Attach();                       // command: stream into the poller
  void Finalize(std::uint32_t flags);  // command: close, flush, go to ERR
  void Detach();                       // command: Destroy's work
  // Detach of a stream that ends in order: FIN (if not sent yet), drop what
  // the peer sent, close without RST. Transmit gate held.
  void CloseStreamInOrder();
  void FlushReceives();                // command: flush the own RQ
  void OnTimer(std::chrono::steady_clock::time_point now);  // a timer of ours is due
  void OnPollEvent(bool readable, bool writable, bool hangup);
  // OnPollEvent's transmit half, for a socket this wake-up found writable;
  // all of it for a QP not finalized (its stream stays open), so it also
  // runs on a polling thread that helps (Engine::HelpTransmit), while the
  // progress thread waits for it before any detach.
  void TransmitWhenWritable();
  // Epoll interest (poll_mutex_): TX arms/disarms write interest; when the
  // peer closed, RX stops read interest (EPOLLIN/EPOLLRDHUP would stay set,
  // level-triggered) but keeps the fd so an orderly drain can still wait for
  // writability; Finalize removes it.
  bool SetWriteInterest(bool want) override;
  void NoteTxIdle() override;
  void StopPolling() override;
  // A Read of ours waits for its response (the ORQ is not empty).
  bool ReadsOutstanding() const;
  void StopReading() override;

  void EmitEvent(AsyncEventType type);

  Engine* const engine_;
  const std::uint32_t qp_num_;
  const QpConfig config_;
  const std::unique_ptr<ReceiveQueue> own_rq_;  // null when config_.srq is used
  ReceiveQueue* const rq_;                      // own_rq_ or config_.srq

  QpStateMachine state_;                 // atomic
  std::atomic<bool> destroyed_{false};   // Destroy called
  // Send posts in RTR are queued (QueueSendsBeforeStream); cleared at RESET.
  std::atomic<bool> queue_sends_before_stream_{false};
  std::atomic<bool> ib_teardown_{false};             // UseIbTeardown
  std::atomic<bool> peer_closed_gracefully_{false};  // RX: FIN at a message boundary
  std::atomic<bool> receives_held_{false};           // Finalize kept the RQ (ib_teardown_)
  std::atomic<std::chrono::nanoseconds::rep> ib_retry_timeout_ns_{0};  // SetIbRetryTimeout
  // RX -> TX: we may transmit (the peer's RTR, or the first FPDU a
  // responder waits for, arrived; true at once otherwise).
  std::atomic<bool> rtr_received_{false};
  // The teardown bound of the current stream in steady_clock ticks; 0 until
  // the stream starts ending (set once per stream, cleared at Bind/RESET).
  std::atomic<std::chrono::steady_clock::rep> teardown_deadline_{0};

  mutable std::mutex queue_mutex_;
  SendRing sq_;                          // guarded by queue_mutex_
  std::unique_ptr<WorkRing<OrqEntry>> orq_;  // guarded by queue_mutex_; made at Bind
  std::unique_ptr<WorkRing<IrqEntry>> irq_;  // guarded by queue_mutex_; made at Bind
  std::uint32_t irq_outstanding_ = 0;    // guarded by queue_mutex_; requests not fully answered
  bool sq_finalized_ = false;            // guarded by queue_mutex_; TX is dead, flush at post
  bool sq_error_seen_ = false;           // guarded by queue_mutex_; a WR completed in error
  // Guarded by queue_mutex_: Finalize kept the send WRs (SetIbRetryTimeout),
  // and the steady_clock deadline of the oldest (0: no clock runs).
  bool sends_held_ = false;
  std::chrono::steady_clock::rep held_sends_deadline_ = 0;
  bool bound_ = false;                   // guarded by queue_mutex_
  StreamParams params_;                  // guarded by queue_mutex_; set at Bind
  std::size_t max_ulpdu_ = 0;            // guarded by queue_mutex_; set at Bind
  std::unique_ptr<transport::TcpStream> pending_stream_;  // guarded by queue_mutex_; Bind -> Attach
  // Mailbox to the transmit side: set under queue_mutex_, then tx_mail_.
  std::optional<rdmap::TerminateHeader> tx_terminate_;  // guarded by queue_mutex_
  TxClose tx_close_ = TxClose::kNone;                   // guarded by queue_mutex_
  std::atomic<bool> tx_mail_{false};

  mutable std::mutex info_mutex_;
  bool error_raised_ = false;            // guarded by info_mutex_
  std::optional<rdmap::TerminateHeader> terminate_sent_;      // guarded by info_mutex_
  std::optional<rdmap::TerminateHeader> terminate_received_;  // guarded by info_mutex_
  std::optional<rdmap::TerminateCause> local_error_;          // guarded by info_mutex_

  mutable std::mutex poll_mutex_;
  bool polled_ = false;       // guarded by poll_mutex_; the engine's poller watches the fd
  // The fd is in the poller's set (ApplyPollInterest), with an empty mask
  // while a read lease or an answer spin holds its read interest.
  bool registered_ = false;   // guarded by poll_mutex_
  bool want_write_ = false;   // guarded by poll_mutex_
  // want_write_ for readers without poll_mutex_ (PollMayWait): the socket
  // was full and the transmit side waits for EPOLLOUT.
  std::atomic<bool> tx_blocked_{false};
  // The SQ's tail when the transmit pump last stopped idle (NoteTxIdle),
  // kTxBusy from the start of each pump. Equal to the tail: no post since,
  // and what the SQ holds waits for input (PollMayWait, ReadsOwnInput).
  static constexpr std::uint64_t kTxBusy = ~std::uint64_t{0};
  std::atomic<std::uint64_t> tx_idle_at_tail_{kTxBusy};
  // tx_idle_at_tail_ says so, tx_blocked_ does not: nothing this thread
  // could send. queue_mutex_ held.
  bool TxIdleLocked() const;
  // Sets tx_blocked_ and counts it in the engine (Engine::tx_blocked_streams);
  // poll_mutex_ held.
  void SetTxBlocked(bool blocked);
  bool read_closed_ = false;  // guarded by poll_mutex_
  // Read interest is off while an application thread drives the receive
  // side from its CQ polls (the read lease), so the progress thread is not
  // woken for data that thread reads anyway. Every driving poll extends the
  // lease to now + kReadLease; it ends on the progress thread when it runs
  // out (OnTimer, at growing intervals while it is extended, then the
  // engine's lease watch: read_lease.h), when a CQ of ours is armed, and
  // with the stream.
  bool read_leased_ = false;  // guarded by poll_mutex_
  // The progress thread's next look at the lease and the interval before
  // it (CheckReadLease); a timer due earlier leaves the lease alone, and
  // so does every timer once the lease is watched (kLeaseWatched).
  static constexpr std::chrono::steady_clock::time_point kLeaseWatched =
      std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point lease_check_at_{};        // guarded by poll_mutex_
  std::chrono::steady_clock::duration lease_check_interval_{};    // guarded by poll_mutex_
  std::atomic<std::uint64_t> read_lease_looks_{0};
  std::atomic<std::uint64_t> read_leases_taken_{0};
  std::atomic<std::chrono::steady_clock::rep> read_lease_until_{0};
  // DriveFromPoll: no receive turn before this (kEmptyPollBackoff), and
  // how many it took. Written under rx_mutex_, read without it.
  std::atomic<std::chrono::steady_clock::rep> poll_idle_until_{0};
  std::atomic<std::uint64_t> poll_receive_turns_{0};
  // When a receive turn of DriveFromPoll last read octets (kInputGapBeforeWait).
  std::atomic<std::chrono::steady_clock::rep> last_poll_input_{0};
  // StreamLeftToProgress: rx_syscalls when a poll last saw it change, and when
  // (steady_clock ticks); a post restarts the count (~0). Written by
  // polling threads without a lock: a race misjudges one poll.
  std::atomic<std::uint64_t> quiet_mark_{~std::uint64_t{0}};
  std::atomic<std::chrono::steady_clock::rep> quiet_since_{0};
  // rx_octets at the last PostSend and at the one before, and whether at
  // least kSinkOctets came in between the last two posts, or 2 x
  // kSinkOctets between the last and the one two before
  // (StreamLeftToProgress).
  std::atomic<std::uint64_t> sink_mark_{0};
  std::atomic<std::uint64_t> sink_mark_before_{0};
  std::atomic<bool> sink_{false};
  // Transmit coalescing (PostSendList): the CQs' poll count at the last
  // post, and the payload octets posted since the last transmit (both
  // guarded by queue_mutex_); whether a transmit is owed, and whether the
  // fallback timer is pending.
  std::uint64_t polls_at_post_ = ~std::uint64_t{0};
  std::uint64_t coalesced_octets_ = 0;
  std::atomic<bool> tx_owed_{false};
  std::atomic<bool> tx_owed_timer_{false};
  std::atomic<std::uint64_t> coalesced_posts_{0};
  std::atomic<std::uint64_t> tx_wakes_owned_{0};
  std::atomic<std::uint64_t> tx_kicks_left_to_epollout_{0};
  std::atomic<std::uint64_t> tx_kicks_to_owner_{0};
  std::atomic<std::uint64_t> tx_kicks_left_to_poll_{0};
  // The progress thread owns the transmit gate (RunTx; a hint, read
  // without the gate). An application post that finds it so does not add
  // a kick for it to pump but leaves its transmit to the next poll: with
  // every post a kick, the progress thread stayed the sender of a stream
  // whose application then spun in its polls, three busy threads on two
  // CPUs and half the throughput (performance-notes 3.38).
  std::atomic<bool> tx_pumped_by_progress_{false};
  std::atomic<const std::function<void()>*> progress_pump_hook_{nullptr};
  // Polling thread: true once no read has returned data for
  // kQuietBeforePollWait, as far as the polls can tell, or while the QP is
  // a sink: kSinkOctets came in since its last PostSend, or between its
  // last two, or 2 x kSinkOctets over its last three.
  bool StreamLeftToProgress(std::chrono::steady_clock::rep now);
  int poll_fd_ = -1;          // guarded by poll_mutex_
  // Sets the fd's interest in the poller (it stays registered, with an
  // empty mask, unless read_closed_: see there); with poll_mutex_ held.
  // Returns an errno.
  int ApplyPollInterest(bool read, bool write);
  // Application thread in DriveFromPoll (rx_mutex_ held): extends the lease,
  // taking read interest off at its start.
  void ExtendReadLease(std::chrono::steady_clock::time_point now);
  // Any thread: read interest back (level-triggered: data that came during
  // the lease wakes the progress thread at once).
  void EndReadLease();
  // Progress thread, for the engine's lease watch: ends the lease if it ran
  // out by `now`. False if the QP holds no lease any more (it leaves the
  // watch).
  bool LookAtWatchedLease(std::chrono::steady_clock::time_point now);
  // Read interest could not be put back (EndReadLease, AwaitAnswer): the
  // QP fails, as nothing would read its stream.
  void ReadInterestLost();
  // With poll_mutex_ held, for the read lease and the answer spin: take read
  // interest off (false if it is off already or stays on), and put it back
  // (true if that failed: ReadInterestLost).
  bool TakeReadInterestLocked();
  bool ReturnReadInterestLocked();

  // Owned by the transmit-gate holder. `stream_` is set and reset only on the
  // progress thread while it holds the gate exclusively, so the gate holder
  // and the progress thread may both use it.
  std::atomic<std::uint32_t> tx_gate_{0};
  std::atomic<std::uint32_t> sq_cq_gate_{0};
  // Set by the gate holder from before a sendmsg until the octets it took
  // are accounted (IRD count included); see WaitForSendAccounting.
  std::atomic<bool> send_accounting_{false};
  std::unique_ptr<transport::TcpStream> stream_;
  // The TCP_NOTSENT_LOWAT last set on stream_ (0: the system's default);
  // written by the gate holder, atomic for unsent_limit().
  std::atomic<std::size_t> unsent_limit_{0};
  QpTx tx_;

  // The receive side runs on the progress thread, or on an application
  // thread in DriveFromPoll, always with rx_mutex_ held (application
  // threads only try it). The flags below are written by the progress
  // thread with rx_mutex_ held, so the progress thread reads them freely and
  // others under rx_mutex_. Lock order: rx_mutex_ before the transmit gate.
  std::mutex rx_mutex_;
  QpRx rx_;                    // guarded by rx_mutex_
  bool attached_ = false;      // written by the progress thread under rx_mutex_
  bool finalized_ = false;     // same: Finalize ran
  bool detached_ = false;      // same
  bool driven_ = false;        // progress thread: registered with both CQs as a driver
  // Progress thread: when the wait for the first FPDU / the RTR ends.
  std::optional<std::chrono::steady_clock::time_point> first_fpdu_deadline_;

  // This QP's slot in the process's statistics file (`siwx stat`), or null
  // (SIWX_STATS=off, no slot left). Taken at creation, freed in ~Qp.
  stats::QpSlot* const stats_slot_ = stats::StatsFile::AcquireForProcess(qp_num_);

  // Counters: single writer each (the transmit gate's owner for tx_*, the
  // rx_mutex_ holder for rx_*), relaxed atomics so readers need no lock.
  // They live in the stats slot when there is one, so `siwx stat` reads
  // them with no extra work on the data path.
  using AtomicCounters = stats::QpCounterBlock;
  // counters_.rx_fpdus at the last post (placement: a ping-pong post
  // follows something received). Guarded by queue_mutex_.
  std::uint64_t rx_fpdus_at_post_ = 0;
  // The answer spin (AwaitAnswer): armed by a ping-pong post, with
  // counters_.rx_fpdus then; its current budget (ns); when the last
  // ping-pong post was made (steady_clock ticks). Posting and polling
  // threads, relaxed: a race misjudges one spin.
  bool ArmAnswerSpin(std::uint64_t fpdus_in);  // true if it armed
  std::atomic<bool> answer_armed_{false};
  std::atomic<std::uint64_t> answer_mark_{0};
  std::atomic<std::int64_t> answer_budget_ns_{0};
  std::atomic<std::chrono::steady_clock::rep> last_pingpong_post_{0};
  std::atomic<std::uint64_t> answer_spins_{0};
  std::atomic<std::uint64_t> answers_caught_{0};
  AtomicCounters own_counters_;
  AtomicCounters& counters_ = stats_slot_ != nullptr ? stats_slot_->counters : own_counters_;
};

}  // namespace siwx::engine
