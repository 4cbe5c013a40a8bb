// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Where the progress thread runs relative to the application threads.
//
// Application threads note the CPU they run on when they post to one of the
// engine's QPs whose inbound work the progress thread does
// (NoteApplicationCpu), and clear the note when they read a QP's stream
// themselves under the read lease (NoteApplicationDrives: the progress
// thread is then off the data path; kept away from ib_read_lat's requester
// it measured 27-38 us in most runs instead of 10). The progress thread of an
// engine configured with ProgressAffinity::kAway keeps off the noted CPU
// (Apply, before it sleeps). On two CPUs with a busy-polling application in
// each of two processes, a progress thread that shares its CPU with its own
// spinning application is served late after its wake-up (ib_write_lat 16-36
// us in such runs), while one on the other CPU is woken where its peer just
// sent and runs at once (6 us); docs/performance-notes.md 3.5. Bandwidth
// wants the same split: the thread that moves data on a CPU of its own.
//
// Per engine, not per process: a thread that waits on another device
// context (perftest's rdma_cm handshake QP, which ib_read_lat's responder
// polls while its progress thread answers on the measured one) says nothing
// about who consumes this engine's work.
//
// Limits: the last note wins and stays until another replaces it; the
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
