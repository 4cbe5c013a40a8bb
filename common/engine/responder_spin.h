// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// When the progress thread polls its sockets for a while before it sleeps,
// by default (without SIWX_PROGRESS_SPIN_US): only while it is the one that
// answers a Read ping-pong.
//
// Why (docs/performance-notes.md 3.8): perftest's ib_read_lat responder
// application makes no verbs call on the measured QP (it polls another
// device context's CQ), so every small Read Request waits for this thread to
// wake from epoll_wait, tens of microseconds for an idle vCPU; a spin makes
// the wake-up unnecessary. Spinning everywhere (SIWX_PROGRESS_SPIN_US) costs
// ib_write_lat 4x, where both applications already spin on memory: so the
// spin is armed only by a wake-up in which this thread itself queued a small
// Read Request (an application driving the QP from its CQ polls answers
// them on its own thread and arms nothing; Writes and Sends never arm it).
//
// Adaptive as SIWX_PROGRESS_SPIN_US: a spin that finds nothing halves the
// next one; the full length returns only when a wake-up answered a small
// Read Request and came soon after the thread went to wait (found by the
// spin, or a sleep no longer than the full length: a full spin would have
// caught it). A requester that reads less often than every `max` lets the
// spin die out after a few halvings (about 2 x max of CPU in all).
// Bulk Reads (above kSmallRead) never arm it: their responder is busy
// anyway and would spin while its socket is full.
//
// Pure policy: no clock, no threads; the progress thread owns it
// (Engine::WaitForEvents).
#pragma once

#include <chrono>
#include <cstdint>

namespace siwx::engine {

class ResponderSpin {
 public:
  static constexpr std::chrono::microseconds kDefaultMax{50};
  // Largest Read (octets) whose request arms the spin.
  static constexpr std::uint32_t kSmallRead = 4096;

  explicit ResponderSpin(std::chrono::nanoseconds max = kDefaultMax) : max_(max) {}

  // A Read Request of `size` octets was queued on the progress thread.
  void OnReadRequest(std::uint32_t size) {
    if (size <= kSmallRead) small_read_ = true;
  }
  // How long to poll without blocking before the next sleep (zero: sleep).
  std::chrono::nanoseconds budget() const { return budget_; }
  std::chrono::nanoseconds max() const { return max_; }
  // A spin of budget() ran out without events: the next one is half as long.
  void OnSpinFoundNothing() {
    budget_ /= 2;
    if (budget_ < std::chrono::microseconds(1)) budget_ = {};
  }
  // The events of one wake-up were handled. `soon`: they were found by the
  // spin, or by a sleep that lasted at most max(). Returns true if the spin
  // was (re)armed to its full length.
  bool OnWakeupHandled(bool soon) {
    const bool arm = small_read_ && soon && max_ > std::chrono::nanoseconds::zero();
    small_read_ = false;
    if (arm) budget_ = max_;
    return arm;
  }
  // Whether a sleep of `slept` counts as soon for OnWakeupHandled.
  bool SleptBriefly(std::chrono::nanoseconds slept) const { return slept <= max_; }

 private:
  const std::chrono::nanoseconds max_;
  std::chrono::nanoseconds budget_{0};
  bool small_read_ = false;  // since the last OnWakeupHandled
};

}  // namespace siwx::engine
