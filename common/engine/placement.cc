// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/placement.h"

namespace siwx::engine {

void ProgressPlacement::Start() {
  if (affinity_ != ProgressAffinity::kAway) return;
  if (sched_getaffinity(0, sizeof(allowed_), &allowed_) != 0 || CPU_COUNT(&allowed_) < 2) return;
  enabled_ = true;
}

void ProgressPlacement::Apply() {
  if (!enabled_) return;
  const int cpu = application_cpu_.load(std::memory_order_relaxed);
  if (cpu == applied_ && cpu == candidate_) return;  // settled: no clock read
  const auto now = std::chrono::steady_clock::now();
  if (cpu != candidate_) {
    candidate_ = cpu;
    candidate_since_ = now;
    candidate_wakeups_ = 0;
    return;
  }
  // Settled: seen at kSettleWakeups wake-ups in a row (a ping-pong wakes the
  // thread once a message: its first slow iterations end after a few), or
  // for kSettle (a thread woken rarely).
  if (++candidate_wakeups_ < kSettleWakeups && now - candidate_since_ < kSettle) return;
  applied_ = cpu;
  // A CPU outside the inherited set needs no avoiding: the whole set again.
  const int avoid = cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &allowed_) ? cpu : -1;
  if (avoid == avoided_) return;
  cpu_set_t target = allowed_;
  if (avoid >= 0) CPU_CLR(avoid, &target);
  // Fails only if a cpuset took CPUs away since Start: stay where we are.
  if (sched_setaffinity(0, sizeof(target), &target) == 0) avoided_ = avoid;
}

}  // namespace siwx::engine
