// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// rdma_get_cm_event racing rdma_destroy_id and rdma_destroy_event_channel on
// other threads, made to happen on purpose: the CM's test seams
// (CoreTestHooks) stop a thread where the race needs it. This program links
// the CM objects rather than librdmacm-siwx.so, to reach the seams.
//
// The rule checked is the kernel's (drivers/infiniband/core/ucma.c with
// librdmacm, rdmacm-ext/README.md "Event delivery and teardown"): a reader
// woken for an event that is then discarded waits again, also when its
// channel is destroyed meanwhile; rdma_destroy_id returns only when the
// events already returned for the id are acked, without deadlocking a
// thread that destroys from its own event loop. rping of rdma-core 44 (the
// apps.rping tests) exits 255 when rdma_get_cm_event fails at teardown.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>

#include "rdmacm-ext/cm_core.h"
#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

// Counts the calls of each seam; a test may hold a thread in after_wake.
struct Seams {
  std::mutex mu;
  std::condition_variable cv;
  int blocks = 0;
  int wakes = 0;
  int ack_waits = 0;
  bool hold_first_wake = false;
  bool released = false;

  Seams() {
    CoreTestHooks h;
    h.before_block = [](void* arg) { static_cast<Seams*>(arg)->Count(&Seams::blocks); };
    h.after_wake = [](void* arg) {
      auto* s = static_cast<Seams*>(arg);
      std::unique_lock lock(s->mu);
      ++s->wakes;
      s->cv.notify_all();
      if (s->hold_first_wake && s->wakes == 1) s->cv.wait(lock, [&] { return s->released; });
    };
    h.awaiting_acks = [](void* arg) { static_cast<Seams*>(arg)->Count(&Seams::ack_waits); };
    h.arg = this;
    Core::Get().SetTestHooks(h);
  }
  ~Seams() { Core::Get().SetTestHooks({}); }

  void Count(int Seams::*counter) {
    std::lock_guard lock(mu);
    ++(this->*counter);
    cv.notify_all();
  }
  // Generous: the awaited step follows in microseconds on an idle machine.
  bool Await(const std::function<bool()>& done) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, done);
  }
  void Poke() {
    std::lock_guard lock(mu);
    cv.notify_all();
  }
  void Release() {
    std::lock_guard lock(mu);
    released = true;
    cv.notify_all();
  }
};

// A one-shot signal between two threads.
class Latch {
 public:
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 20s, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Raises an event on `id` at once: ADDR_RESOLVED, or ADDR_ERROR where no
// device serves loopback (CM-only mode).
void RaiseEvent(rdma_cm_id* id) {
  sockaddr_in dst = Loopback4(9);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
}

// rping 44 at client teardown: rdma_disconnect raises DISCONNECTED, which
// wakes the CM thread blocked in rdma_get_cm_event; before that thread
// looks, the main thread destroys the id (discarding the unread event) and
// the channel. In the kernel the woken reader finds no event and sleeps
// again, in a file the close could not release; it must not fail (rping
// exits 255 when it does). The reader then blocks for ever, so the scenario
// runs in a child process that ends with _exit once the reader waits again.
void WokenReaderOfADestroyedChannel() {
  Seams seams;
  seams.hold_first_wake = true;
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) std::_Exit(20);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) std::_Exit(21);
  std::thread reader([ch] {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) {
      std::fprintf(stderr, "rdma_get_cm_event: %s\n", std::strerror(errno));
      std::_Exit(3);
    }
    std::fprintf(stderr, "rdma_get_cm_event returned a discarded %s\n",
                 rdma_event_str(ev->event));
    std::_Exit(4);
  });
  if (!seams.Await([&] { return seams.blocks == 1; })) std::_Exit(22);
  RaiseEvent(id);
  if (!seams.Await([&] { return seams.wakes == 1; })) std::_Exit(23);
  if (rdma_destroy_id(id) != 0) std::_Exit(24);
  rdma_destroy_event_channel(ch);
  seams.Release();
  // Blocked again, or exited with 3 or 4 above.
  if (!seams.Await([&] { return seams.blocks == 2; })) std::_Exit(25);
  std::_Exit(0);
}

TEST(CmTeardownRaceDeathTest, ReaderWokenForADiscardedEventWaitsAgainInADestroyedChannel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(WokenReaderOfADestroyedChannel(), ::testing::ExitedWithCode(0), "");
}

// A thread that reads the next event of a channel and holds it, unacked,
// until Release(); then it acks it, unless told not to.
class HeldEvent {
 public:
  // Returns the event once the thread holds it; nullptr if it got none.
  rdma_cm_event* Hold(rdma_event_channel* channel, bool ack_at_release = true) {
    thread_ = std::thread([this, channel, ack_at_release] {
      ASSERT_EQ(rdma_get_cm_event(channel, &event_), 0);
      got_.Open();
      release_.Wait();
      if (!ack_at_release) return;
      acked = true;
      EXPECT_EQ(rdma_ack_cm_event(event_), 0);
    });
    return got_.Wait() ? event_ : nullptr;
  }
  void Release() {
    release_.Open();
    if (thread_.joinable()) thread_.join();
  }
  ~HeldEvent() { Release(); }

  std::atomic<bool> acked{false};  // set just before the ack

 private:
  std::thread thread_;
  rdma_cm_event* event_ = nullptr;
  Latch got_;
  Latch release_;
};

// The set-up of the races on one channel: the channel and its ids.
class CmTeardownRace : public LeakCheck {
 protected:
  // Opens the test's channel with an id on it for each of `ids`.
  void OpenChannel(std::initializer_list<rdma_cm_id**> ids, void* context = nullptr) {
    ch = rdma_create_event_channel();
    ASSERT_NE(ch, nullptr);
    for (rdma_cm_id** id : ids) ASSERT_EQ(rdma_create_id(ch, id, context, RDMA_PS_TCP), 0);
  }
  // Destroys the channel; nothing the test made may be left.
  void CloseChannelExpectNoLeaks() {
    rdma_destroy_event_channel(ch);
    ExpectNoLeaks();
  }

  rdma_event_channel* ch = nullptr;
};

// Runs `call` on a thread of its own while another thread holds an event of
// the channel's id unacked; expects the call to wait for that ack.
void ExpectReturnsAfterTheAck(rdma_event_channel* ch, const char* name,
                              const std::function<int()>& call) {
  Seams seams;
  HeldEvent held;
  ASSERT_NE(held.Hold(ch), nullptr);
  std::atomic<bool> returned{false};
  bool acked_before_return = false;
  std::thread caller([&] {
    EXPECT_EQ(call(), 0);
    acked_before_return = held.acked;
    returned = true;
    seams.Poke();
  });
  EXPECT_TRUE(seams.Await([&] { return seams.ack_waits == 1 || returned; }));
  EXPECT_EQ(seams.ack_waits, 1) << name << " did not wait for the ack";
  held.Release();
  caller.join();
  EXPECT_TRUE(acked_before_return) << name;
}

// rping 44 at server teardown: the CM thread gets DISCONNECTED and wakes the
// main thread (sem_post) before it acks the event; the main thread destroys
// the id. As with librdmacm, rdma_destroy_id returns only after the ack, so
// the CM thread is back in rdma_get_cm_event before the channel goes.
TEST_F(CmTeardownRace, DestroyReturnsAfterAnotherThreadAckedTheIdsEvent) {
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&id}));
  RaiseEvent(id);
  ExpectReturnsAfterTheAck(ch, "rdma_destroy_id", [&] { return rdma_destroy_id(id); });
  CloseChannelExpectNoLeaks();
}

// librdmacm's rdma_migrate_id waits the same way, so that no thread handles
// an event of the id on its old channel once the call returned.
TEST_F(CmTeardownRace, MigrateReturnsAfterAnotherThreadAckedTheIdsEvent) {
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&id}));
  rdma_event_channel* to = rdma_create_event_channel();
  ASSERT_NE(to, nullptr);
  RaiseEvent(id);
  ExpectReturnsAfterTheAck(ch, "rdma_migrate_id", [&] { return rdma_migrate_id(id, to); });
  EXPECT_EQ(id->channel, to);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(to);
  CloseChannelExpectNoLeaks();
}

// Migrating from the thread that holds the id's event does not wait for
// itself (librdmacm would wait for ever).
TEST_F(CmTeardownRace, MigrateFromTheThreadHoldingTheEventDoesNotWait) {
  Seams seams;
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&id}));
  RaiseEvent(id);
  rdma_cm_event* ev = nullptr;
  ASSERT_EQ(rdma_get_cm_event(ch, &ev), 0);
  EXPECT_EQ(rdma_migrate_id(id, nullptr), 0);  // to synchronous mode
  EXPECT_EQ(seams.ack_waits, 0);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  CloseChannelExpectNoLeaks();
}

// An application that destroys an id from its own event loop, before it
// acks the id's event (librdmacm would wait for itself for ever): no wait,
// and the event, with event->id, stays readable until its ack.
TEST_F(CmTeardownRace, DestroyFromTheThreadHoldingTheEventDoesNotWait) {
  Seams seams;
  rdma_cm_id* id = nullptr;
  int context = 7;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&id}, &context));
  RaiseEvent(id);
  rdma_cm_event* ev = nullptr;
  ASSERT_EQ(rdma_get_cm_event(ch, &ev), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_EQ(seams.ack_waits, 0);
  EXPECT_EQ(ev->id->context, &context);  // memory of the id lives until the ack
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(rdma_ack_cm_event(ev), -1);  // acked once only
  EXPECT_EQ(errno, EINVAL);
  CloseChannelExpectNoLeaks();
}

// Two threads each hold an event of the id the other destroys. The first
// destroy waits for the second thread's ack; the second destroy must not
// wait for the first thread, which cannot ack while it waits.
TEST_F(CmTeardownRace, CrossedDestroysDoNotDeadlock) {
  Seams seams;
  rdma_cm_id* x = nullptr;
  rdma_cm_id* y = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&x, &y}));
  RaiseEvent(x);
  rdma_cm_event* x_event = nullptr;
  ASSERT_EQ(rdma_get_cm_event(ch, &x_event), 0);  // this thread holds x's event
  Latch y_held;
  std::thread other([&] {
    RaiseEvent(y);
    rdma_cm_event* y_event = nullptr;
    ASSERT_EQ(rdma_get_cm_event(ch, &y_event), 0);
    y_held.Open();
    // This thread destroys x once the main thread waits in destroy(y).
    EXPECT_TRUE(seams.Await([&] { return seams.ack_waits >= 1; }));
    EXPECT_EQ(rdma_destroy_id(x), 0);
    EXPECT_EQ(rdma_ack_cm_event(y_event), 0);
  });
  ASSERT_TRUE(y_held.Wait());
  EXPECT_EQ(rdma_destroy_id(y), 0);  // returns when `other` acked y's event
  other.join();
  EXPECT_EQ(seams.ack_waits, 1);
  EXPECT_EQ(rdma_ack_cm_event(x_event), 0);
  CloseChannelExpectNoLeaks();
}

// A CONNECT_REQUEST counts for its listener, as in librdmacm: destroying the
// new id while another thread holds the request does not wait; destroying
// the listener does.
TEST_F(CmTeardownRace, ARequestCountsForItsListener) {
  Seams seams;
  Listener l;
  l.Start();
  Client c;
  c.Resolve(l.port);
  ASSERT_EQ(c.Connect(), 0);
  HeldEvent held;
  rdma_cm_event* req = held.Hold(l.channel);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(rdma_destroy_id(req->id), 0);
  EXPECT_EQ(seams.ack_waits, 0);
  std::thread destroyer([&] {
    EXPECT_EQ(rdma_destroy_id(l.id), 0);
    l.id = nullptr;
  });
  EXPECT_TRUE(seams.Await([&] { return seams.ack_waits == 1; }));
  held.Release();
  destroyer.join();
  l.Stop();
  c.Stop();
  ExpectNoLeaks();
}

// A thread that never acks holds rdma_destroy_id up for Core::kAckWait at
// most (librdmacm: for ever); the event stays valid until its late ack.
TEST_F(CmTeardownRace, AnEventNeverAckedHoldsDestroyUpForALimitedTime) {
  rdma_cm_id* id = nullptr;
  ASSERT_NO_FATAL_FAILURE(OpenChannel({&id}));
  RaiseEvent(id);
  HeldEvent held;
  rdma_cm_event* ev = held.Hold(ch, /*ack_at_release=*/false);
  ASSERT_NE(ev, nullptr);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, Core::kAckWait);
  held.Release();
  EXPECT_EQ(ev->id, id);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  CloseChannelExpectNoLeaks();
}

}  // namespace
}  // namespace siwx::cm::test
