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
// Streams of Reads never arm it, and a wake-up that sees one stops it: a
// Read above kSmallRead, or a Request queued while its QP still owes an
// earlier Response (ib_read_bw keeps many outstanding), or small Requests
// found by the spin's first poll at two wake-ups in a row (Wake::kAtOnce:
// they did not wait for the previous Response; one alone is also what a
// ping-pong looks like when this thread was preempted between a Response
// and its spin, docs/performance-notes.md 3.15). Their responder is busy
// anyway, and a spinning one
// took CPU from the requester: 64-octet ib_read_bw lost 10-30% with an
// earlier rule that armed on any small Read. After kYieldAfter of empty
// polling the spin yields between polls (Engine::WaitAfterResponderSpin).
// Most of its polls read the socket of the QP whose Request came last
// (Engine::Spin), saving the epoll_wait before each read
// (docs/performance-notes.md 3.28).
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
  // How long the spin polls before it also yields between polls.
  static constexpr std::chrono::microseconds kYieldAfter{15};
  // Largest Read (octets) whose request arms the spin.
  static constexpr std::uint32_t kSmallRead = 4096;

  explicit ResponderSpin(std::chrono::nanoseconds max = kDefaultMax) : max_(max) {}

  // A Read Request of `size` octets was queued on the progress thread, its
  // QP now owing `outstanding` Read Responses (this one included). More
  // than one owed, or a large Read, is a stream (ib_read_bw), not a
  // ping-pong: that wake-up stops the spin.
  void OnReadRequest(std::uint32_t size, std::uint32_t outstanding) {
    if (size > kSmallRead || outstanding > 1) {
      stream_ = true;
    } else {
      small_read_ = true;
    }
  }
  // How long to poll without blocking before the next sleep (zero: sleep).
  std::chrono::nanoseconds budget() const { return budget_; }
  std::chrono::nanoseconds max() const { return max_; }
  // A spin of budget() ran out without events: the next one is half as long.
  void OnSpinFoundNothing() {
    budget_ /= 2;
    if (budget_ < std::chrono::microseconds(1)) budget_ = {};
  }
  // How the events of a wake-up were found.
  enum class Wake : unsigned char {
    kLate,    // after a sleep longer than max()
    kSoon,    // by the spin after an empty poll, or after a sleep <= max()
    kAtOnce,  // by the spin's first poll: they were there when it began
  };
  // The events of one wake-up were handled. A Read Request that was already
  // waiting when the spin began came without waiting for the previous
  // Response, as in a stream; a ping-pong's next Request needs the Response
  // to reach the requester first. But a responder preempted right after its
  // Response (a woken thread took its CPU for 10-30 us) also finds the next
  // Request at once, so only a second such wake-up in a row stops the spin:
  // a stream shows itself at every wake-up, a preemption once (stopping
  // there put the responder to sleep, and the next Request waited for its
  // wake-up too). The first neither arms nor stops. Returns true if the
  // spin was (re)armed to its full length.
  bool OnWakeupHandled(Wake wake) {
    if (small_read_) {
      if (wake == Wake::kAtOnce && read_at_once_before_) stream_ = true;
      read_at_once_before_ = wake == Wake::kAtOnce;
    }
    const bool arm = small_read_ && !stream_ && wake == Wake::kSoon &&
                     max_ > std::chrono::nanoseconds::zero();
    if (stream_) budget_ = {};
    small_read_ = false;
    stream_ = false;
    if (arm) budget_ = max_;
    return arm;
  }
  // Whether a sleep of `slept` counts as soon for OnWakeupHandled.
  bool SleptBriefly(std::chrono::nanoseconds slept) const { return slept <= max_; }

 private:
  const std::chrono::nanoseconds max_;
  std::chrono::nanoseconds budget_{0};
  // Since the last OnWakeupHandled.
  bool small_read_ = false;
  bool stream_ = false;
  // The last wake-up that queued a small Read found it at once.
  bool read_at_once_before_ = false;
};

}  // namespace siwx::engine
