// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// NextPollWait: an empty poll's bounded wait doubles while nothing is
// pushed, up to kMaxPollWait, and activity brings back the configured
// length (a poller on an idle CQ woke every 50 us for a whole ib_read_lat
// run: docs/performance-notes.md 3.11).
#include "common/engine/poll_wait_backoff.h"

#include <gtest/gtest.h>

#include <chrono>

namespace siwx::engine {
namespace {

using std::chrono::microseconds;

TEST(PollWaitBackoff, WaitsThatRunOutDoubleUpToTheBound) {
  const microseconds configured(50);
  microseconds wait = configured;
  const microseconds expected[] = {microseconds(100), microseconds(200), microseconds(400),
                                   microseconds(800), kMaxPollWait, kMaxPollWait};
  for (const microseconds next : expected) {
    wait = NextPollWait(configured, wait, PollWaitOutcome::kRanOut);
    EXPECT_EQ(wait, next);
  }
}

TEST(PollWaitBackoff, ActivityBringsBackTheConfiguredWait) {
  const microseconds configured(50);
  EXPECT_EQ(NextPollWait(configured, kMaxPollWait, PollWaitOutcome::kActivity), configured);
  EXPECT_EQ(NextPollWait(configured, configured, PollWaitOutcome::kActivity), configured);
}

// While a responder spins in the process, waits grow further: each
// wake-up of an idle poller took a CPU from the Read ping-pong
// (docs/performance-notes.md 3.15). Activity still resets them.
TEST(PollWaitBackoff, BesideASpinningResponderWaitsGrowToTheLongerBound) {
  const microseconds configured(50);
  microseconds wait = kMaxPollWait;
  const microseconds expected[] = {microseconds(2000), microseconds(4000),
                                   kMaxPollWaitBesideSpin, kMaxPollWaitBesideSpin};
  for (const microseconds next : expected) {
    wait = NextPollWait(configured, wait, PollWaitOutcome::kRanOut, /*beside_spin=*/true);
    EXPECT_EQ(wait, next);
  }
  EXPECT_EQ(NextPollWait(configured, wait, PollWaitOutcome::kActivity, true), configured);
  // The spin ended: the next wait is back within the usual bound.
  EXPECT_EQ(NextPollWait(configured, wait, PollWaitOutcome::kRanOut, false), kMaxPollWait);
  EXPECT_EQ(NextPollWait(microseconds(0), wait, PollWaitOutcome::kRanOut, true).count(), 0);
}

// A configured wait above the bound is kept as it is, never shortened.
TEST(PollWaitBackoff, AConfiguredWaitAboveTheBoundStays) {
  const microseconds configured = kMaxPollWait * 3;
  EXPECT_EQ(NextPollWait(configured, configured, PollWaitOutcome::kRanOut), configured);
}

// SIWX_POLL_WAIT_US=0 turns waits off: nothing grows out of zero.
TEST(PollWaitBackoff, ZeroStaysOff) {
  EXPECT_EQ(NextPollWait(microseconds(0), microseconds(0), PollWaitOutcome::kRanOut).count(), 0);
  EXPECT_EQ(NextPollWait(microseconds(0), kMaxPollWait, PollWaitOutcome::kRanOut).count(), 0);
}

}  // namespace
}  // namespace siwx::engine
