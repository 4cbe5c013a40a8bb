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
