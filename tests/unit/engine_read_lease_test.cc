// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// CheckReadLease: when the progress thread looks at a QP's read lease. A
// lease that keeps being extended is looked at less and less often (so a
// busy-polling application is not preempted by a wake-up every millisecond),
// never less often than kMaxReadLeaseCheck, and a lapsed one ends at once.
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
// extended to about now + kReadLease. The looks then come after 2, 4, 8, 8,
// ... ms, not after every millisecond (the 99th percentile of ib_send_lat,
// docs/performance-notes.md 3.9).
TEST(ReadLeaseCheck, AnExtendedLeaseIsLookedAtLessOftenUpToTheBound) {
  Clock::time_point now = kStart + kReadLease;  // the first look: the lease's first end
  Clock::duration interval = kReadLease;
  int looks = 0;
  const Clock::time_point stop = kStart + milliseconds(100);
  while (now < stop) {
    const ReadLeaseCheck check = CheckReadLease(now, now + kReadLease - microseconds(1), interval);
    ASSERT_FALSE(check.end);
    EXPECT_GT(check.next, now);
    EXPECT_LE(check.next - now, kMaxReadLeaseCheck);
    EXPECT_GE(check.interval, interval);
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
