// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The connection manager behind librdmacm-siwx.so: rdma_cm ids, event
// channels and events, TCP listen/connect, and MPA startup (RFC 5044 7.1,
// the Rtr/S-bit proposal, RFC 6581) driven by mpa::MpaNegotiator, ending in
// the handover of the connected socket to the id's QP (siwxdv.h).
//
// Objects. Each public struct (rdma_event_channel, rdma_cm_id,
// rdma_cm_event) is the first member of a private wrapper; the public
// pointers the application holds are looked up in registries, so an unknown
// or stale pointer is EINVAL, never a crash.
//
// Threads and ownership. One CM thread per process runs an epoll loop over
// listening, connecting and handshaking sockets, their deadlines, and the
// provider's stream notifications. It exists while at least one id exists:
// the first rdma_create_id starts it and the last rdma_destroy_id joins it
// (so a process with no ids has no CM thread, epoll fd or wake-up fd).
// Application threads and the CM thread share all state under one mutex,
// mu_; nothing blocks while holding it (sockets are non-blocking). Blocking
// happens only in rdma_get_cm_event (and the synchronous-id calls built on
// it), reading the channel's eventfd outside the lock, and in
// rdma_destroy_id, waiting for acks (below). The provider's notify
// callback takes only notify_mu_, so the CM may call into the provider
// while holding mu_.
//
// Event channels are eventfds used as a level: readable exactly while the
// channel has queued events (signalled and cleared under mu_ only), so the
// fd is pollable and a poll that says "readable" is never followed by a
// blocking rdma_get_cm_event. rdma_get_cm_event blocks unless the
// application set O_NONBLOCK on the fd (then -1/EAGAIN).
//
// Teardown, as the kernel's rdma_ucm and librdmacm (rdmacm-ext/README.md,
// "Event delivery and teardown"): a reader that wakes to find the event it
// woke for gone (another reader took it, or rdma_destroy_id discarded it
// unread) waits again; a reader blocked in a channel that is destroyed stays
// blocked (the channel lives on, unreachable, with its fd open, while a
// reader is in it); rdma_destroy_id discards the id's
// queued events and then waits until the events already returned for it
// are acked (a CONNECT_REQUEST counts for its listener), except those held
// by the calling thread or by a thread itself waiting for acks, and at most
// kAckWait; rdma_migrate_id waits the same way after it moved the id; an
// id's memory lives until its last returned event is acked, so event->id
// stays readable.
//
// Events and their status (the Linux iw_cm mapping where it has one):
//   ADDR_RESOLVED / ADDR_ERROR (-ENODEV: no siwx device serves the address;
//     -errno of the route lookup), ROUTE_RESOLVED (immediate: TCP routes),
//   CONNECT_REQUEST (listen_id, a new id with verbs set, the Request's
//     private data and its IRD/ORD as responder_resources/initiator_depth),
//   CONNECT_RESPONSE (active side whose QP the application created itself,
//     rdma_conn_param.qp_num: rdma_establish then binds it; as on InfiniBand,
//     it takes the place of ESTABLISHED),
//   ESTABLISHED (the Reply's private data on the active side),
//   REJECTED: MPA Reply with R = 1 (status -ECONNREFUSED, with the peer's
//     private data), TCP refused (-ECONNREFUSED) or reset/closed during
//     startup (-ECONNRESET),
//   UNREACHABLE: TCP connect or MPA startup timeout (-ETIMEDOUT), no route
//     (-EHOSTUNREACH, -ENETUNREACH),
//   CONNECT_ERROR: invalid or unexpected startup frames (wrong key, Rev 0 or
//     3+, PD_Length over 512, Initiator/Initiator, enhanced mismatch, CRC or
//     marker refusal, insufficient IRD, no matching RTR): -EPROTO; other
//     socket errors and handover failures: -errno,
//   DISCONNECTED: once per connection, on rdma_disconnect or when the peer
//     or the provider ends the stream.
// Never raised: TIMEWAIT_EXIT (IB CM only; iWARP has no time-wait state to
// report), DEVICE_REMOVAL (siwx devices are never removed; link changes are
// port events), ADDR_CHANGE, multicast events.
//
// A connection that fails before its CONNECT_REQUEST is raised (a peer that
// is not MPA, silent, or resets) is dropped silently (logged at info); the
// listener keeps serving. Listener backlog: at most `backlog` connections
// whose CONNECT_REQUEST was raised and awaits rdma_accept/rdma_reject; beyond
// that the listener stops accepting and the kernel queue applies.
//
// Hostile peers. A connection accepted but whose MPA Request is not complete
// yet is half-open. Half-open connections do not take backlog slots; they
// are bounded per peer address and in total (CmConfig, SIWX_CM_HALF_OPEN_*):
// at a bound the oldest one of that address (or of all) is dropped for the
// new one, so a port scan or a silent or trickling peer cannot keep honest
// peers out, whose Request arrives with or right after the TCP handshake.
// Only one older than kHalfOpenGrace is dropped: a burst of honest connects
// from one host (cmtime, MPI start-up) outruns the peer's own CM thread, so
// young half-open connections are mostly Requests still on their way. While
// the oldest is younger, the new one is kept (the bound is exceeded by one)
// and the listener stops accepting until a Request arrives or the oldest
// reaches the grace age, when it is dropped if the bound is still exceeded
// (with or without another connection to make room for); meanwhile the
// kernel queue holds the rest, whose Requests are then read at once.
// Each lives at most SIWX_MPA_TIMEOUT_MS from its accept (the negotiator's
// deadline is not renewed by partial frames). When accept4 fails for want
// of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), the listener
// stops polling for kAcceptBackoffMin, doubling to kAcceptBackoffMax while
// it keeps failing, then tries again: the waiting connections stay queued
// in the kernel and are served once descriptors are free, and the CM thread
// keeps serving the other connections meanwhile. (Accepting with a reserved
// descriptor and closing at once would refuse the honest peers in the
// queue, and would hold a descriptor of the application's for nothing.)
//
// fork(). pthread_atfork handlers take mu_ (and the other two locks) around
// fork(), so a child never inherits them held. The child has none of the
// parent's threads and must not touch the parent's connections: it forgets
// every id, channel and event it inherited (their memory stays, so reading
// an inherited rdma_cm_id still works, but every call with one is EINVAL)
// and closes its references to the CM's sockets, epoll and wake-up fds; a
// new rdma_create_id in the child starts afresh. Everything is close-on-exec.
//
// Not validated here: the FPDU stream after the handover (the engine's),
// IB-only parameters (retry counts, flow control), and whether the
// application's QP matches the id's device beyond the context pointer.
#pragma once

#include <rdma/rdma_cma.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mpa/mpa_negotiator.h"
#include "rdmacm-ext/cm_config.h"
#include "rdmacm-ext/cm_socket.h"
#include "rdmacm-ext/siwx_cm.h"

namespace siwx::cm {

// The value of an enum that came from C code, read without assuming it is
// one of the enumerators (an out-of-range enum load is undefined behaviour).
template <typename E>
int EnumValue(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

struct CmId;

struct CmEvent {
  rdma_cm_event pub{};
  std::vector<std::uint8_t> private_data;  // pub.param.conn.private_data points here
  CmId* id = nullptr;                      // the id the event is about (alive until acked)
  std::uint64_t id_handle = 0;             // its handle, to find it again safely
  CmId* listener = nullptr;                // CONNECT_REQUEST: the listening id
  // Once returned by rdma_get_cm_event: the thread it went to, and the id
  // whose rdma_destroy_id waits for its ack (the listener's for a request).
  std::thread::id holder;
  std::uint64_t reported_for = 0;
};

struct CmChannel {
  rdma_event_channel pub{};
  std::deque<CmEvent*> queue;  // guarded by Core::mu_
  bool sync = false;           // the private channel of a synchronous id
  int readers = 0;             // threads blocked in rdma_get_cm_event on it (mu_)
  // Destroyed while readers were blocked in it: out of the registry, no
  // events, fd still open; the last reader to leave frees it.
  bool destroyed = false;
};

enum class IdState : std::uint8_t {
  kIdle,
  kBound,           // rdma_bind_addr: socket bound
  kAddrResolved,
  kRouteResolved,
  kListening,
  kTcpConnecting,   // active: non-blocking connect in flight
  kMpaStartup,      // negotiator running
  kRequestPending,  // passive: CONNECT_REQUEST raised, rdma_accept/rdma_reject pending
  kFlushing,        // MPA done; writing the last startup frame before the handover
  kAwaitEstablish,  // active: CONNECT_RESPONSE raised, rdma_establish pending
  kEstablished,
  kDisconnected,
  kRejected,        // rejected by us (passive) or by the peer (active)
  kFailed,          // setup failed; the event says how
};
std::string_view IdStateName(IdState s);

struct CmId {
  rdma_cm_id pub{};
  std::uint64_t handle = 0;   // epoll cookie, stream-notify cookie, log prefix CEP[n]
  CmChannel* channel = nullptr;
  bool sync = false;
  bool hidden = false;        // passive id whose CONNECT_REQUEST is not raised yet
  IdState state = IdState::kIdle;
  MpaOptions options;
  std::optional<std::uint8_t> tos;
  bool reuseaddr = false;
  bool app_bound = false;     // rdma_bind_addr (or rdma_listen) bound the socket
  std::optional<bool> afonly;

  int fd = -1;                // owned unless handed to the QP (then -1)
  bool registered = false;    // fd is in the epoll set
  std::uint32_t interest = 0;

  // A listening id.
  struct Listen {
    int backlog = 0;
    int pending = 0;  // children whose CONNECT_REQUEST awaits the application
    // accept4 ran out of descriptors or memory; poll again then.
    std::optional<TimePoint> accept_retry_at;
    std::chrono::milliseconds accept_backoff{0};
    // accept_retry_at is a pause for a young half-open connection (not a
    // descriptor shortage): a Request that arrives ends it early.
    bool half_open_pause = false;
    // The address whose connection went over a bound and started the pause:
    // when the pause ends, its oldest is dropped if still over (the bound
    // held by one more meanwhile), whether or not another one comes.
    std::optional<net::SockAddr> half_open_pause_peer;
  } listen;
  TimePoint accepted_at{};    // child of a listener: when accept4 returned it
  CmId* listener = nullptr;   // child of a listener, until rdma_accept/rdma_reject
  bool backlog_slot = false;  // child: counted in listener->pending

  mpa::MpaRole role = mpa::MpaRole::kInitiator;
  bool started = false;       // a connection was attempted
  std::optional<TimePoint> connect_deadline;
  // The MPA startup phase and what it agreed.
  struct Mpa {
    std::unique_ptr<mpa::MpaNegotiator> negotiator;
    std::uint16_t ird = 0;  // initiator: offered; responder: accepted
    std::uint16_t ord = 0;
    std::uint8_t request_ird = 0;  // values raised with CONNECT_REQUEST (rdma_accept(NULL))
    std::uint8_t request_ord = 0;
    bool done = false;
    // kFlushing: the peer must take the last startup frame by then.
    std::optional<TimePoint> flush_deadline;
    mpa::NegotiatedParams negotiated;
    mpa::MpaError error = mpa::MpaError::kNone;
  } mpa;
  std::vector<std::uint8_t> private_data;  // initiator: for the Request
  std::uint32_t conn_qp_num = 0;
  // Responder: the QP rdma_accept named by number (rdma_conn_param.qp_num).
  std::optional<std::uint32_t> target_qp_num;
  std::uint32_t own_qp_num = 0;  // pub.qp->qp_num, read when the CM created it

  std::string failure;
  siwx_cm_failure failure_code = SIWX_CM_FAILURE_NONE;
  int last_status = 0;
  bool peer_gone = false;     // passive: the peer left while the request was pending

  // The established stream, once a QP took it.
  struct Stream {
    bool bound = false;
    // The number of the QP that owns the stream on pub.verbs. Never a
    // pointer: the application may destroy the QP (ibv_destroy_qp) on any
    // thread, so the provider finds it by number under the lock its destroy
    // takes.
    std::uint32_t qp_num = 0;
    bool disconnect_posted = false;
    // The peer closed or reset the stream while the QP's CQs still held
    // successful completions the application had not polled: DISCONNECTED
    // waits until they are polled, or until this time (Core::kDisconnectHold).
    std::optional<TimePoint> held_until;
    int held_error = 0;
  } stream;

  std::optional<ibv_qp_init_attr> ep_qp_init_attr;  // rdma_create_ep, passive

  // Returned events not yet acked whose pub.id or pub.listen_id is this id;
  // a destroyed id (out of the registries) is freed when this reaches 0.
  int unacked_refs = 0;
  bool destroyed = false;
};

// Test seams: tests/cm/cm_teardown_race_test.cc links the CM objects and
// stops threads at these points to make races happen on purpose. Null in
// the library; called without mu_ held.
struct CoreTestHooks {
  void (*before_block)(void* arg) = nullptr;  // rdma_get_cm_event is about to block
  void (*after_wake)(void* arg) = nullptr;    // ... and woke up, before it looks again
  void (*awaiting_acks)(void* arg) = nullptr; // rdma_destroy_id waits for acks
  void* arg = nullptr;
};

class Core {
 public:
  static Core& Get();

  // How long a peer's DISCONNECTED waits at most for the application to
  // poll what the QP completed before the close, and how often the CM looks.
  static constexpr std::chrono::milliseconds kDisconnectHold{500};
  static constexpr std::chrono::milliseconds kDisconnectRecheck{1};
  // A listener whose accept4 fails for want of descriptors or memory waits
  // this long before it tries again, doubling up to the maximum.
  static constexpr std::chrono::milliseconds kAcceptBackoffMin{10};
  static constexpr std::chrono::milliseconds kAcceptBackoffMax{500};
  // The youngest half-open connection a bound may drop (see above).
  static constexpr std::chrono::milliseconds kHalfOpenGrace{200};
  // The longest rdma_destroy_id and rdma_migrate_id wait for other threads
  // to ack the events they hold of the id (librdmacm waits for ever).
  static constexpr std::chrono::milliseconds kAckWait{2000};

  // All return 0 or a positive errno value.
  int CreateChannel(rdma_event_channel** out);
  void DestroyChannel(rdma_event_channel* channel);
  int GetEvent(rdma_event_channel* channel, rdma_cm_event** out);
  int AckEvent(rdma_cm_event* event);

  int CreateId(rdma_event_channel* channel, rdma_cm_id** out, void* context,
               rdma_port_space ps, ibv_qp_type qp_type);
  int DestroyId(rdma_cm_id* id);
  int MigrateId(rdma_cm_id* id, rdma_event_channel* channel);
  int BindAddr(rdma_cm_id* id, const sockaddr* addr);
  int ResolveAddr(rdma_cm_id* id, const sockaddr* src, const sockaddr* dst);
  int ResolveRoute(rdma_cm_id* id);
  int Listen(rdma_cm_id* id, int backlog);
  int Connect(rdma_cm_id* id, const rdma_conn_param* param);
  int Accept(rdma_cm_id* id, const rdma_conn_param* param);
  int Reject(rdma_cm_id* id, const void* private_data, std::uint8_t len);
  int Disconnect(rdma_cm_id* id);
  int Establish(rdma_cm_id* id);
  int GetRequest(rdma_cm_id* listen, rdma_cm_id** out);
  int Notify(rdma_cm_id* id);
  int SetOption(rdma_cm_id* id, int level, int optname, const void* value, std::size_t len);
  int InitQpAttr(rdma_cm_id* id, ibv_qp_attr* attr, int* mask);
  int CreateQpEx(rdma_cm_id* id, ibv_qp_init_attr_ex* attr);
  void DestroyQp(rdma_cm_id* id);
  int SetEpQpInitAttr(rdma_cm_id* id, const ibv_qp_init_attr& attr, ibv_pd* pd);
  void ClearEpQpInitAttr(rdma_cm_id* id);
  bool KnownId(rdma_cm_id* id);

  int GetMpaOptions(rdma_cm_id* id, siwx_cm_mpa_options* out);
  int SetMpaOptions(rdma_cm_id* id, const siwx_cm_mpa_options& in);
  int ConnectionInfo(rdma_cm_id* id, siwx_cm_conn_info* out);
  int PeerPrivateData(rdma_cm_id* id, void* buf, std::size_t len, std::size_t* full);

  // siwx_stream_notify.event: any thread.
  static void OnStreamEvent(std::uint64_t cookie, int event, int error);

  void SetTestHooks(const CoreTestHooks& hooks);

  // pthread_atfork handlers (registered by Get()).
  void BeforeFork();
  void AfterForkInParent();
  void AfterForkInChild();

 private:
  struct Linger {
    int fd = -1;
    bool registered = false;
    bool shut = false;                 // FIN sent
    std::vector<std::uint8_t> out;     // still to write before the FIN
    TimePoint deadline;
  };
  struct StreamNote {
    std::uint64_t cookie;
    int event;
    int error;
  };

  Core() = default;

  // Loop lifetime (lifecycle_mu_, then mu_).
  int EnsureLoop();
  void StopLoopIfIdle();
  void Run();
  void Wake();
  // Wakes the loop if it sleeps past a deadline armed since it went to
  // sleep. With mu_ held.
  void WakeForTimers();

  // Everything below runs with mu_ held.
  CmId* FindId(rdma_cm_id* pub);
  CmChannel* FindChannel(rdma_event_channel* pub);
  CmChannel* NewChannel(bool sync, int* err);
  void FreeChannel(CmChannel* ch);
  // rdma_migrate_id's move: the id, its queued events and its listener's
  // unreported requests go from `old` (may be null) to `target`.
  void MoveId(CmId* id, CmChannel* old, CmChannel* target, bool sync);
  CmId* NewId(CmChannel* channel, bool sync, void* context, rdma_port_space ps,
              ibv_qp_type qp_type);
  void DestroyLocked(CmId* id);
  // Frees a destroyed id once no returned event refers to it any more.
  void FreeIdIfUnreferenced(CmId* id);
  // Forgets a returned event (acked, or left in a synchronous id's event).
  void ReleaseReturned(CmEvent* ev);
  // rdma_destroy_id and rdma_migrate_id (`call`, for the warning): waits
  // until the events returned for the id with `handle` are acked (see the
  // teardown rules above).
  void WaitForAcks(std::unique_lock<std::mutex>& lock, std::uint64_t handle, const char* call);
  bool AwaitsAck(std::uint64_t handle) const;
  // A reader leaves a channel it blocked in.
  void LeaveChannel(CmChannel* ch);
  CmEvent* Post(CmId* id, rdma_cm_event_type type, int status, ByteSpan private_data = {},
                std::uint32_t ird = 0, std::uint32_t ord = 0);
  void RemoveQueuedEvents(CmId* id);
  // Forgets the event a synchronous call left in id->pub.event.
  void DropSyncEvent(CmId* id);
  void ReleaseBacklogSlot(CmId* id);
  void SetInterest(CmId* id, std::uint32_t interest);
  void UpdateInterest(CmId* id);
  void CloseSocket(CmId* id, bool abortive);
  void MoveToLinger(CmId* id, ByteSpan out);
  void DriveLinger(std::uint64_t handle, const net::Poller::Event& ev);
  void HandleIo(std::uint64_t cookie, const net::Poller::Event& ev);
  void AcceptPending(CmId* listener);
  void BackOffAccepting(CmId* listener, int error);
  // A child accepted but whose MPA Request is not complete yet.
  static bool IsHalfOpen(const CmId* id);
  // Drops the oldest half-open connection from `peer`'s address, or of all,
  // when a new one from `peer` would exceed a bound (`incoming` 1), or when
  // they already exceed it (`incoming` 0: the end of a pause). Returns when
  // the listener may accept the next one: now (nullopt), or later, when the
  // one to drop was younger than kHalfOpenGrace and was kept.
  std::optional<TimePoint> MakeRoomForHalfOpen(const net::SockAddr& peer, TimePoint now,
                                               std::size_t incoming = 1);
  void ResumeAfterHalfOpenPause(CmId* listener);
  void FailFlushing(CmId* id, int error, const char* why);
  void StartInitiatorMpa(CmId* id);
  void FailConnect(CmId* id, int error);
  void Drive(CmId* id, bool hangup);
  int FlushNegotiatorOutput(CmId* id);
  void ProcessNegotiatorEvents(CmId* id);
  void OnRequestReceived(CmId* id);
  void OnMpaEstablished(CmId* id);
  void OnMpaRejected(CmId* id, const mpa::NegotiatorEvent& ev);
  void OnMpaFailed(CmId* id, const mpa::NegotiatorEvent& ev);
  void FinishHandover(CmId* id);
  // `qp_num`: the QP on pub.verbs to take the stream; none in CM-only use.
  void BindAndEstablish(CmId* id, std::optional<std::uint32_t> qp_num, bool post_established);
  void PeerClosed(CmId* id, int error);
  void EndBoundStream(CmId* id, bool abortive);
  void SendTerminate(CmId* id, mpa::MpaError error);
  void OnTimers(TimePoint now);
  // True while the id's bound QP has successful completions in its CQs that
  // the application has not polled yet.
  bool HasUnpolledCompletions(CmId* id);
  void ReleaseHeldDisconnects(TimePoint now);
  int NextTimeoutMs(TimePoint now);
  // The timers. OnTimers looks through the ids only once the earliest
  // deadline is due (a thousand ids in startup, scanned on every turn of the
  // loop, cost the CM thread a third of its time): each place that sets an
  // id's deadline (connect, MPA negotiator, handover flush, accept retry) or
  // a linger's calls ArmTimers / ArmTimer, which bring next_timer_ forward.
  void ArmTimer(TimePoint deadline);
  void ArmTimers(const CmId* id);
  static std::optional<TimePoint> EarliestDeadline(const CmId* id);
  void DrainStreamNotes();
  int WaitSync(rdma_cm_id* pub);
  void LogEstablished(const CmId* id);

  std::mutex lifecycle_mu_;  // serialises starting and joining the CM thread
  std::thread thread_;       // guarded by lifecycle_mu_

  std::mutex mu_;
  bool stop_ = false;                                             // mu_
  std::unique_ptr<net::Poller> poller_;                           // mu_ (fixed while running)
  std::unique_ptr<net::Doorbell> wake_;                           // mu_ (fixed while running)
  std::size_t live_ids_ = 0;                                      // mu_
  std::uint64_t next_handle_ = 1;                                 // mu_
  std::unordered_map<rdma_event_channel*, CmChannel*> channels_;  // mu_
  std::unordered_map<rdma_cm_id*, CmId*> ids_;                    // mu_
  std::unordered_map<std::uint64_t, CmId*> by_handle_;            // mu_
  std::unordered_map<rdma_cm_event*, CmEvent*> events_;           // mu_: retrieved, not acked
  std::condition_variable acked_;           // with mu_: an event in events_ was released
  std::vector<std::thread::id> ack_waiters_;  // mu_: threads in WaitForAcks
  CoreTestHooks test_hooks_;                                      // mu_
  std::unordered_map<std::uint64_t, Linger> lingers_;             // mu_
  TimePoint next_timer_ = TimePoint::max();                       // mu_: see ArmTimers
  std::optional<TimePoint> sleeping_with_timer_;  // mu_: next_timer_ while the loop sleeps
  std::set<std::uint64_t> held_;  // mu_: handles whose DISCONNECTED waits (stream.held_until)
  // Handles of half-open children in accept order; entries that stopped
  // being half-open are pruned lazily.
  std::deque<std::uint64_t> half_open_;                           // mu_

  std::mutex notify_mu_;
  int notify_wake_fd_ = -1;              // notify_mu_: wake_'s fd while the loop runs
  std::vector<StreamNote> notes_;        // notify_mu_
};

}  // namespace siwx::cm
