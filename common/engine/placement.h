// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Where the progress thread runs relative to the application threads.
//
// An application thread that posts to an idle send queue of one of the
// engine's QPs after something came in on it, without the read lease (a
// ping-pong whose answer the progress thread places), notes its CPU
// (NoteApplicationCpu); one that reads a stream itself under the read
// lease, or posts behind outstanding WRs or with nothing received since its
// last post (a stream, where the progress thread and the application
// already run apart), clears the note (ClearApplicationCpu). The progress thread of an engine configured with
// ProgressAffinity::kAway keeps off the noted CPU (Apply, before it sleeps).
//
// Why (docs/performance-notes.md 3.7, 2 vCPUs, one busy-polling
// application thread per process): a progress thread sharing its CPU with
// its own spinning application thread is served late after its wake-up
// (ib_write_lat 16-36 us in such runs), while one on the other CPU is woken
// where the peer just sent and runs at once (6 us). The lease exception:
// ib_read_lat's requester reads its Read Responses itself, and its progress
// thread kept away from it measured 29-33 us instead of 10. Bandwidth wants
// the same split: the thread that moves data on a CPU other than the one
// the application spins on.
//
// Limits: per engine (device context); the last note wins and stays until
// another replaces it; a note must stay the same for kSettle or
// kSettleWakeups wake-ups before the thread moves (threads posting from
// several CPUs move nothing); the
// progress thread's allowed set is the one it inherited when it started; an
// affinity change an application makes for the progress thread later is
// overridden at the next change of the hint. A process allowed one CPU is
// left alone.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>

namespace siwx::engine {

enum class ProgressAffinity : unsigned char {
  kAny,   // the scheduler places the progress thread (no affinity change)
  kAway,  // off the CPU the application last posted from (no read lease)
};

// One per engine. Note: application threads; the rest: the progress thread.
class ProgressPlacement {
 public:
  explicit ProgressPlacement(ProgressAffinity affinity) : affinity_(affinity) {}

  // Application thread that posted to an idle send queue of a QP, after
  // something came in on it, whose inbound work the progress thread does
  // (no read lease): a ping-pong; records the current CPU (one rseq read; a store only when it
  // changed).
  void NoteApplicationCpu() {
    if (affinity_ != ProgressAffinity::kAway) return;
    Store(sched_getcpu());
  }
  // Application thread that reads its QP's stream itself (it holds the read
  // lease), or posts behind outstanding WRs (streaming): the progress thread
  // need not move (off the path, or better placed by the scheduler).
  void ClearApplicationCpu() {
    if (affinity_ == ProgressAffinity::kAway) Store(-1);
  }

  // Progress thread, once before its loop: reads the thread's allowed CPUs.
  void Start();
  // Progress thread, before it sleeps: moves it off the application's CPU
  // once the hint has stayed the same at kSettleWakeups calls in a row, or
  // for kSettle (seen at two calls that far apart). A hint that flips
  // (threads posting from several CPUs, a requester that posts once before
  // it takes the read lease) moves nothing.
  void Apply();

  // The CPU the thread keeps off, -1 for none (progress thread; tests).
  int avoided_cpu() const { return avoided_; }

  static constexpr std::chrono::milliseconds kSettle{1};
  // A ping-pong wakes the thread once a message; until it moves, every
  // message waits behind a spinner (20 us instead of 6; 1 ms of them was
  // about 24 of ib_write_lat's 5 000 iterations: docs/performance-notes.md
  // 3.21).
  static constexpr int kSettleWakeups = 8;

 private:
  void Store(int cpu) {
    // Loaded first: a store per post would bounce the line between posters.
    if (application_cpu_.load(std::memory_order_relaxed) != cpu) {
      application_cpu_.store(cpu, std::memory_order_relaxed);
    }
  }

  const ProgressAffinity affinity_;
  std::atomic<int> application_cpu_{-1};
  // Progress thread only.
  bool enabled_ = false;
  cpu_set_t allowed_{};
  int avoided_ = -1;
  int applied_ = -1;    // the hint acted on
  int candidate_ = -1;  // the hint seen at the last Apply, since candidate_since_
  std::chrono::steady_clock::time_point candidate_since_{};
  int candidate_wakeups_ = 0;  // Apply calls that saw candidate_ again
};

}  // namespace siwx::engine
