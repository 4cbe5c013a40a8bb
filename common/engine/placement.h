// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Where the progress thread runs relative to the application threads.
//
// Application threads note, for the whole process, the CPU they run on when
// they poll a CQ or post to a QP without the read lease (NoteApplicationCpu,
// NoteApplicationPosts). The progress thread of an engine configured with
// ProgressAffinity::kAway keeps off that CPU (Apply, before it sleeps),
// unless an application thread reads one of that engine's streams itself
// under the read lease (NoteApplicationDrives): the progress thread is then
// off the data path and stays on all its CPUs.
//
// Why (docs/performance-notes.md 3.5, 2 vCPUs, one busy-polling
// application thread per process): a progress thread sharing its CPU with
// a spinning application thread of its own process is served late after its
// wake-up (ib_write_lat 16-36 us in such runs), while one on the other CPU
// is woken where the peer just sent and runs at once (6 us). Process-wide,
// because the spinning thread may wait on another device context:
// ib_read_lat's responder spins on perftest's rdma_cm handshake QP while
// its progress thread answers Read Requests on the measured one. The lease
// exception, because ib_read_lat's requester reads its Read Responses itself
// and its progress thread kept away from it measured 27-38 us in most runs
// instead of 10. Bandwidth wants the same split: the thread that moves data
// on a CPU other than the one the application spins on.
//
// Limits: the last note wins and stays until another replaces it; a note
// must stay the same for kSettle before the thread moves (threads polling
// from several CPUs move nothing); the progress thread's allowed set is the
// one it inherited when it started; an affinity change an application makes
// for the progress thread later is overridden at the next change of the
// hint. A process allowed one CPU is left alone.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>

namespace siwx::engine {

enum class ProgressAffinity : unsigned char {
  kAny,   // the scheduler places the progress thread (no affinity change)
  kAway,  // off the CPU the process's application threads last polled or posted from
};

// Application threads, process-wide: records the current CPU (one rseq read;
// a store only when it changed) when a thread posts or polls, once an
// engine with kAway exists.
void NoteApplicationCpu();

// One per engine. Note*: application threads; the rest: the progress thread.
class ProgressPlacement {
 public:
  explicit ProgressPlacement(ProgressAffinity affinity) : affinity_(affinity) {}

  // Application thread that posted to a QP whose inbound work the progress
  // thread does (no read lease).
  void NoteApplicationPosts() {
    if (affinity_ != ProgressAffinity::kAway) return;
    if (self_driven_.load(std::memory_order_relaxed)) {
      self_driven_.store(false, std::memory_order_relaxed);
    }
    NoteApplicationCpu();
  }
  // Application thread that reads a QP's stream itself (it holds the read
  // lease): the progress thread is off that path and need not move.
  void NoteApplicationDrives() {
    if (affinity_ == ProgressAffinity::kAway && !self_driven_.load(std::memory_order_relaxed)) {
      self_driven_.store(true, std::memory_order_relaxed);
    }
  }

  // Progress thread, once before its loop: reads the thread's allowed CPUs.
  void Start();
  // Progress thread, before it sleeps: moves it off the application's CPU
  // once the hint has stayed the same for kSettle (seen at two wake-ups that
  // far apart). A hint that flips (threads posting from several CPUs, a
  // requester that posts once before it takes the read lease) moves nothing.
  void Apply();

  // The CPU the thread keeps off, -1 for none (progress thread; tests).
  int avoided_cpu() const { return avoided_; }

  static constexpr std::chrono::milliseconds kSettle{1};

 private:
  const ProgressAffinity affinity_;
  std::atomic<bool> self_driven_{false};
  // Progress thread only.
  bool enabled_ = false;
  cpu_set_t allowed_{};
  int avoided_ = -1;
  int applied_ = -1;    // the hint acted on
  int candidate_ = -1;  // the hint seen at the last Apply, since candidate_since_
  std::chrono::steady_clock::time_point candidate_since_{};
};

}  // namespace siwx::engine
