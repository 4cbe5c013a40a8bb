// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// read_lease.h: when the progress thread looks at a QP's read lease. A
// lease that keeps being extended is looked at less and less often (so a
// busy-polling application is not preempted by a wake-up every millisecond),
// then handed to the engine's lease watch, whose alarm the polls keep
// pushing out; a lapsed lease ends at the next look.
#include "common/engine/read_lease.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <vector>

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
// extended to about now + kReadLease. The looks come 1, 2 and 4 ms apart,
// not every millisecond (the 99th percentile of ib_send_lat,
// docs/performance-notes.md 3.9), and the look that would wait the bound
// hands the lease to the watch instead.
TEST(ReadLeaseCheck, AnExtendedLeaseIsLookedAtLessOftenThenWatched) {
  Clock::time_point now = kStart + kReadLease;  // the first look: the lease's first end
  Clock::duration interval = kReadLease;
  std::vector<Clock::duration> gaps;
  for (;;) {
    const ReadLeaseCheck check = CheckReadLease(now, now + kReadLease - microseconds(1), interval);
    ASSERT_FALSE(check.end);
    if (check.watch) break;
    ASSERT_LT(gaps.size(), 8u);
    EXPECT_GT(check.next, now);
    EXPECT_EQ(check.interval, 2 * interval);
    gaps.push_back(check.next - now);
    interval = check.interval;
    now = check.next;
  }
  EXPECT_EQ(gaps, (std::vector<Clock::duration>{milliseconds(2), milliseconds(4)}));
  EXPECT_EQ(interval * 2, kMaxReadLeaseCheck);
}

// Once the application stops polling, the lease ends at the next look:
// about as long again as it was held while the looks still double.
TEST(ReadLeaseCheck, ALeaseThatStopsBeingExtendedEndsWithinTheInterval) {
  // Held briefly: the next look comes 2 ms after the first.
  const Clock::time_point until = kStart + kReadLease + microseconds(500);
  const ReadLeaseCheck first = CheckReadLease(kStart + kReadLease, until, kReadLease);
  ASSERT_FALSE(first.end);
  ASSERT_FALSE(first.watch);
  EXPECT_EQ(first.next, kStart + kReadLease + 2 * kReadLease);
  EXPECT_TRUE(CheckReadLease(first.next, until, first.interval).end);
}

// The watch as a polling thread and the progress thread run it
// (Engine::PushLeaseWatch, LookAtWatchedLeases): the alarm is due
// kMaxReadLeaseCheck after the earliest watched end, and a poll re-arms it
// once `now` passes LeaseWatchRearmAfter.
class LeaseWatchModel {
 public:
  explicit LeaseWatchModel(std::size_t leases) : until_(leases, Clock::time_point{}) {}

  // A poll of lease `i` at `now` extends it, and re-arms the alarm if due.
  void Poll(std::size_t i, Clock::time_point now) {
    until_[i] = now + kReadLease;
    if (now >= rearm_after_) Rearm(now);
  }
  void Rearm(Clock::time_point now) {
    due_ = LeaseWatchDue(*std::min_element(until_.begin(), until_.end()));
    rearm_after_ = LeaseWatchRearmAfter(now, due_);
    ++rearms_;
  }
  Clock::time_point due() const { return due_; }
  int rearms() const { return rearms_; }

 private:
  std::vector<Clock::time_point> until_;
  Clock::time_point due_ = Clock::time_point::max();
  Clock::time_point rearm_after_ = Clock::time_point::max();
  int rearms_ = 0;
};

// A thread that polls without a pause keeps the alarm from ever going off
// (the progress thread stays asleep: performance-notes 3.32), at the cost
// of about one re-arm per half bound.
TEST(LeaseWatch, PollsWithoutAPauseKeepTheAlarmAway) {
  LeaseWatchModel watch(1);
  watch.Poll(0, kStart);
  watch.Rearm(kStart);  // the lease is handed over
  const Clock::time_point stop = kStart + milliseconds(100);
  for (Clock::time_point now = kStart; now < stop; now += microseconds(7)) {
    ASSERT_GT(watch.due(), now);
    watch.Poll(0, now);
  }
  // 100 ms at one re-arm every 4 ms, and the hand-over.
  EXPECT_LE(watch.rearms(), 27);
  EXPECT_GE(watch.rearms(), 20);
}

// A lease that lapses while another one is polled on: the other's polls
// re-arm the alarm at most once per kReadLease, never past the lapsed
// lease's end + kMaxReadLeaseCheck, so the progress thread ends it that
// soon.
TEST(LeaseWatch, AnotherLeasesPollsDoNotHoldOffALapsedOne) {
  LeaseWatchModel watch(2);
  watch.Poll(0, kStart);
  watch.Poll(1, kStart);
  watch.Rearm(kStart);
  const Clock::time_point lapse = kStart + milliseconds(30);  // lease 1's last poll
  Clock::time_point now = kStart;
  for (; now < lapse; now += microseconds(7)) {
    watch.Poll(0, now);
    watch.Poll(1, now);
  }
  const int rearms_at_lapse = watch.rearms();
  while (now < watch.due()) {
    watch.Poll(0, now);
    now += microseconds(7);
  }
  EXPECT_LE(now - lapse, kReadLease + kMaxReadLeaseCheck + microseconds(7));
  EXPECT_LE(watch.rearms() - rearms_at_lapse, 10);
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
