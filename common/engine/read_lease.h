// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// When the progress thread looks at a QP's read lease (Qp::OnTimer and the
// engine's lease watch).
//
// An application thread that drives a QP from its CQ polls holds the read
// lease: read interest is off the poller, and every driving poll moves the
// lease's end to now + kReadLease. Only the progress thread can end a lease
// that ran out (the application may have stopped polling), so it must wake
// to look. Looking at the lease's end every time meant a wake-up per
// millisecond for as long as an application busy-polled, and on a machine
// whose CPUs all run spinning applications (ib_send_lat on 2 vCPUs) every
// such wake-up preempts one of them: the 99th percentile of ib_send_lat was
// those wake-ups (docs/performance-notes.md 3.9). So a lease found extended
// is looked at again after twice the previous interval; once that interval
// would reach kMaxReadLeaseCheck the lease goes to the engine's lease watch
// (engine.h): a timer kMaxReadLeaseCheck after the earliest end among the
// watched leases, which the polls that extend them keep pushing out
// (LeaseWatchDue, LeaseWatchRearmAfter), so the progress thread does not
// wake for them at all while they are polled (performance-notes 3.32). A
// lapsed lease ends at the next look: within about as long again as it had
// been held while the looks still double, within kMaxReadLeaseCheck of its
// end once it is watched.
#ifndef SIWX_COMMON_ENGINE_READ_LEASE_H_
#define SIWX_COMMON_ENGINE_READ_LEASE_H_

#include <algorithm>
#include <chrono>

namespace siwx::engine {

// How long a lease lasts after the driving poll that took or extended it.
inline constexpr std::chrono::steady_clock::duration kReadLease = std::chrono::milliseconds(1);
// The longest a lapsed lease that was extended for long waits for its
// end: the interval at which a lease goes to the watch, and how far the
// watch's timer lies behind the earliest watched end.
inline constexpr std::chrono::steady_clock::duration kMaxReadLeaseCheck =
    std::chrono::milliseconds(8);

struct ReadLeaseCheck {
  bool end = false;  // the lease ran out: end it now
  // Otherwise: hand the lease to the watch, or look again at `next` after
  // `interval` (the next look doubles it).
  bool watch = false;
  std::chrono::steady_clock::time_point next{};
  std::chrono::steady_clock::duration interval{};
};

// A look at a lease at `now` that lasts until `until`; `interval` is the
// time since the previous look (kReadLease for the first look, at the end of
// a fresh lease).
constexpr ReadLeaseCheck CheckReadLease(std::chrono::steady_clock::time_point now,
                                        std::chrono::steady_clock::time_point until,
                                        std::chrono::steady_clock::duration interval) {
  if (now >= until) return {.end = true};
  const auto next_interval = std::clamp(interval * 2, kReadLease, kMaxReadLeaseCheck);
  if (next_interval >= kMaxReadLeaseCheck) return {.watch = true};
  return {.next = std::max(until, now + next_interval), .interval = next_interval};
}

// When the lease watch's timer is due: kMaxReadLeaseCheck after the
// earliest end among the watched leases.
constexpr std::chrono::steady_clock::time_point LeaseWatchDue(
    std::chrono::steady_clock::time_point earliest_until) {
  return earliest_until + kMaxReadLeaseCheck;
}

// Until when the polls that extend leases leave the watch's timer alone:
// until it is within half a bound, so a polling thread re-arms it about
// once per half bound (a system call; waking the progress thread instead
// preempted a spinning application), and for at least kReadLease, as a
// lapsed lease holds the timer where it is until it fires.
constexpr std::chrono::steady_clock::time_point LeaseWatchRearmAfter(
    std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point due) {
  return std::max(now + kReadLease, due - kMaxReadLeaseCheck / 2);
}

}  // namespace siwx::engine

#endif  // SIWX_COMMON_ENGINE_READ_LEASE_H_
