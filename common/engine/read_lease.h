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
// kMaxReadLeaseCheck: a lapsed lease ends within min(how long it had been
// held, kMaxReadLeaseCheck) of its end.
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

// A look at a lease at `now` that lasts until `until`; `interval` is the
// time since the previous look (kReadLease for the first look, at the end of
// a fresh lease).
constexpr ReadLeaseCheck CheckReadLease(std::chrono::steady_clock::time_point now,
                                        std::chrono::steady_clock::time_point until,
                                        std::chrono::steady_clock::duration interval) {
  if (now >= until) return {.end = true};
  const auto next_interval = std::clamp(interval * 2, kReadLease, kMaxReadLeaseCheck);
  return {.end = false, .next = std::max(until, now + next_interval), .interval = next_interval};
}

}  // namespace siwx::engine

#endif  // SIWX_COMMON_ENGINE_READ_LEASE_H_
