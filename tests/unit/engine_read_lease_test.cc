// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// CheckReadLease: when the progress thread looks at a QP's read lease. A
// lease that keeps being extended is looked at less and less often (so a
// busy-polling application is not preempted by a wake-up every millisecond),
// then once per kMaxReadLeaseCheck on a grid that every lease shares, and a
// lapsed one ends at once.
#include "common/engine/read_lease.h"

#include <gtest/gtest.h>

#include <chrono>

namespace siwx::engine {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::microseconds;

const Clock::time_point kStart = Clock::time_point(Clock::duration(0)) + std::chrono::hours(1);

TEST(ReadLeaseCheck, ALapsedLeaseEnds) {
  EXPECT_TRUE(CheckReadLease(kStart, kStart, kReadLease).end);
  EXPECT_TRUE(CheckReadLease(kStart + microseconds(1), kStart, kMaxReadLeaseCheck).end);
}

// The application polls without a pause: every look finds the lease
// extended to about now + kReadLease. The looks then come after 2, 4, 4-12,
// 8, 8, ... ms, not after every millisecond (the 99th percentile of
// ib_send_lat, docs/performance-notes.md 3.9), and from the first at the
// bound on the grid's ticks.
TEST(ReadLeaseCheck, AnExtendedLeaseIsLookedAtLessOftenUpToTheBound) {
  Clock::time_point now = kStart + kReadLease;  // the first look: the lease's first end
  Clock::duration interval = kReadLease;
  int looks = 0;
  const Clock::time_point stop = kStart + milliseconds(100);
  while (now < stop) {
    const ReadLeaseCheck check = CheckReadLease(now, now + kReadLease - microseconds(1), interval);
    ASSERT_FALSE(check.end);
    EXPECT_GT(check.next, now);
    EXPECT_LE(check.next - now, kMaxReadLeaseCheck * 3 / 2);
    EXPECT_GE(check.interval, interval);
    if (check.interval == kMaxReadLeaseCheck) {
      EXPECT_EQ(check.next.time_since_epoch() % kMaxReadLeaseCheck, Clock::duration::zero());
    }
    interval = check.interval;
    now = check.next;
    ++looks;
  }
  EXPECT_EQ(interval, kMaxReadLeaseCheck);
  // 100 ms of polling: 2 + 4 + 8 * 11 and a last one; one per millisecond
  // before.
  EXPECT_LE(looks, 16);
}

// Once the application stops polling, the lease ends at the next look: at
// most kMaxReadLeaseCheck after its end, and sooner when it was short.
TEST(ReadLeaseCheck, ALeaseThatStopsBeingExtendedEndsWithinTheInterval) {
  // Held briefly: the next look comes 2 ms after the first.
  const Clock::time_point until = kStart + kReadLease + microseconds(500);
  const ReadLeaseCheck first = CheckReadLease(kStart + kReadLease, until, kReadLease);
  ASSERT_FALSE(first.end);
  EXPECT_EQ(first.next, kStart + kReadLease + 2 * kReadLease);
  EXPECT_TRUE(CheckReadLease(first.next, until, first.interval).end);

  // Held long: the interval is at its bound; the lease ends at the look after.
  const Clock::time_point long_until = kStart + microseconds(300);
  const ReadLeaseCheck look = CheckReadLease(kStart, long_until, kMaxReadLeaseCheck);
  ASSERT_FALSE(look.end);
  EXPECT_EQ(look.next, kStart + kMaxReadLeaseCheck);
  EXPECT_TRUE(CheckReadLease(look.next, long_until, look.interval).end);
}

// Two leases taken at different times, both polled without a pause: once
// their looks are at the bound, they fall on the same ticks, so the progress
// thread wakes once for both (docs/performance-notes.md 3.31). A look at the
// bound is never sooner than half of it after the one before, nor later
// than one and a half.
TEST(ReadLeaseCheck, LeasesOfDifferentAgesAreLookedAtOnTheSameTicks) {
  // As the progress thread runs them: each turn comes at the earliest look
  // due and looks at every lease due by then.
  Clock::time_point next[2] = {kStart + microseconds(1300), kStart + microseconds(5900)};
  Clock::time_point last[2] = {};
  int turns = 0;
  while (std::min(next[0], next[1]) < kStart + milliseconds(100)) {
    const Clock::time_point now = std::min(next[0], next[1]);
    for (int i = 0; i < 2; ++i) {
      if (next[i] > now) continue;
      const ReadLeaseCheck check =
          CheckReadLease(now, now + kReadLease - microseconds(1), kMaxReadLeaseCheck);
      ASSERT_FALSE(check.end);
      EXPECT_GE(check.next - now, kMaxReadLeaseCheck / 2);
      EXPECT_LE(check.next - now, kMaxReadLeaseCheck * 3 / 2);
      EXPECT_EQ(ReadLeaseGridTick(check.next), check.next);
      last[i] = now;
      next[i] = check.next;
    }
    ++turns;
  }
  EXPECT_EQ(next[0], next[1]);
  EXPECT_EQ(last[0], last[1]);
  // Two looks before they meet, then one turn per tick: 2 + 12. On phases
  // of their own, each lease would have had a turn per tick.
  EXPECT_LE(turns, 14);
}

// A lease extended further than the doubled interval (a clock step between
// the polls' and the timer's reading) is not looked at before its end.
TEST(ReadLeaseCheck, NeverLooksBeforeTheLeaseCanHaveRunOut) {
  const Clock::time_point until = kStart + milliseconds(20);
  const ReadLeaseCheck check = CheckReadLease(kStart, until, kReadLease);
  ASSERT_FALSE(check.end);
  EXPECT_EQ(check.next, until);
}

}  // namespace
}  // namespace siwx::engine
