// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// When the progress thread looks at a QP's read lease (Qp::OnTimer).
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
// is looked at again after twice the previous interval, up to
// kMaxReadLeaseCheck. Looks at that bound fall on a grid of its multiples
// of the steady clock (the first at least half a bound away), so that the
// leases of many QPs share the progress thread's wake-ups instead of each
// waking it on a phase of its own. A lapsed lease ends at the next look:
// within about as long again as it had been held while the looks still
// double, within 1.5 x kMaxReadLeaseCheck once they are on the grid.
#ifndef SIWX_COMMON_ENGINE_READ_LEASE_H_
#define SIWX_COMMON_ENGINE_READ_LEASE_H_

#include <algorithm>
#include <chrono>

namespace siwx::engine {

// How long a lease lasts after the driving poll that took or extended it.
inline constexpr std::chrono::steady_clock::duration kReadLease = std::chrono::milliseconds(1);
// The longest the progress thread waits between two looks at a lease that
// keeps being extended.
inline constexpr std::chrono::steady_clock::duration kMaxReadLeaseCheck =
    std::chrono::milliseconds(8);

struct ReadLeaseCheck {
  bool end = false;  // the lease ran out: end it now
  // Otherwise: when to look again, and the interval that led there (the
  // next look doubles it).
  std::chrono::steady_clock::time_point next{};
  std::chrono::steady_clock::duration interval{};
};

// The first tick of the look grid at or after `t`.
constexpr std::chrono::steady_clock::time_point ReadLeaseGridTick(
    std::chrono::steady_clock::time_point t) {
  const auto since_epoch = t.time_since_epoch();
  const auto ticks = (since_epoch + kMaxReadLeaseCheck - std::chrono::steady_clock::duration(1)) /
                     kMaxReadLeaseCheck;
  return std::chrono::steady_clock::time_point(ticks * kMaxReadLeaseCheck);
}

// A look at a lease at `now` that lasts until `until`; `interval` is the
// time since the previous look (kReadLease for the first look, at the end of
// a fresh lease).
constexpr ReadLeaseCheck CheckReadLease(std::chrono::steady_clock::time_point now,
                                        std::chrono::steady_clock::time_point until,
                                        std::chrono::steady_clock::duration interval) {
  if (now >= until) return {.end = true};
  const auto next_interval = std::clamp(interval * 2, kReadLease, kMaxReadLeaseCheck);
  const auto next = next_interval < kMaxReadLeaseCheck
                        ? now + next_interval
                        : ReadLeaseGridTick(now + kMaxReadLeaseCheck / 2);
  return {.end = false, .next = std::max(until, next), .interval = next_interval};
}

}  // namespace siwx::engine

#endif  // SIWX_COMMON_ENGINE_READ_LEASE_H_
