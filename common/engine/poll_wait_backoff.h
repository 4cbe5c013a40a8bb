// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// How long an empty poll's bounded wait lasts (SIWX_POLL_WAIT_US,
// CompletionQueue::PollWithProgress).
//
// A thread that polls a CQ on which nothing arrives (perftest's ib_read_lat
// server polls its key-exchange CQ for the whole test while the progress
// thread answers the Reads) used to wake every SIWX_POLL_WAIT_US: about
// 2,400 wake-ups a second on 2 vCPUs, each of which pushed one of the two
// spinning threads that carry the ping-pong off its CPU, and that was
// ib_read_lat's 99th percentile (docs/performance-notes.md 3.11). A push
// ends a wait at once whatever its length, so a longer wait holds no
// completion back; it only makes a poller that could drive again (it
// posted, or its peer started sending) return later. So a wait that ran
// out with nothing pushed makes the next one twice as long, up to
// kMaxPollWait, and anything that shows activity starts again from the
// configured length.
//
// While a progress thread of this process spins answering a Read ping-pong
// (responder_spin.h), each wake-up of a waiting poller also takes the CPU of
// that spinner or of the requester (on 2 vCPUs both CPUs are busy), and the
// ping-pong's next iteration waits for it: at 1 ms that was one slow
// iteration in a hundred, ib_read_lat's 99th percentile again
// (docs/performance-notes.md 3.15). So the bound is kMaxPollWaitBesideSpin
// then: the waits that wake the poller are the ones with nothing pushed, and
// a push still ends every wait at once.
#ifndef SIWX_COMMON_ENGINE_POLL_WAIT_BACKOFF_H_
#define SIWX_COMMON_ENGINE_POLL_WAIT_BACKOFF_H_

#include <algorithm>
#include <chrono>

namespace siwx::engine {

// The longest a wait grows to (a configured wait above it stays as it is).
inline constexpr std::chrono::microseconds kMaxPollWait{1000};
// The bound while a responder spins in this process.
inline constexpr std::chrono::microseconds kMaxPollWaitBesideSpin{8000};

enum class PollWaitOutcome : unsigned char {
  kRanOut,    // the wait ended at its bound with nothing pushed
  kActivity,  // a push ended it, a poll returned entries, or a poll could not wait
};

// The next wait after one of length `last` ended with `outcome`;
// `configured` is SIWX_POLL_WAIT_US (0: waits are off and stay off);
// `beside_spin`: a responder spins in this process (kMaxPollWaitBesideSpin).
constexpr std::chrono::microseconds NextPollWait(std::chrono::microseconds configured,
                                                 std::chrono::microseconds last,
                                                 PollWaitOutcome outcome,
                                                 bool beside_spin = false) {
  if (configured.count() <= 0 || outcome == PollWaitOutcome::kActivity) return configured;
  const auto bound = std::max(configured, beside_spin ? kMaxPollWaitBesideSpin : kMaxPollWait);
  return std::clamp(last * 2, configured, bound);
}

}  // namespace siwx::engine

#endif  // SIWX_COMMON_ENGINE_POLL_WAIT_BACKOFF_H_
