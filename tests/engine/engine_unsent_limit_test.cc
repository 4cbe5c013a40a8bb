// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Streams of one engine that all wait for their peers share an unsent budget
// (UnsentLimitFor, TCP_NOTSENT_LOWAT): a socket found full gets its share
// of kUnsentBudget for the streams waiting then, a stream that waits alone
// keeps the system's default, and the count of waiting streams stays right
// while application threads and the progress thread transmit on many QPs
// of one CQ at once (docs/performance-notes.md 3.14); and the progress
// thread shares the transmit turns of sockets found writable together with
// a thread that polls their CQ empty (3.36). The peers are raw TCP sockets
// that the test reads when it wants the streams to move.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

TEST(UnsentLimitForTest, EachDoublingOfTheWaitingStreamsHalvesTheShare) {
  EXPECT_EQ(UnsentLimitFor(0), 0u);
  EXPECT_EQ(UnsentLimitFor(1), 0u);  // alone: the system's default
  EXPECT_EQ(UnsentLimitFor(2), kUnsentBudget / 2);
  EXPECT_EQ(UnsentLimitFor(3), kUnsentBudget / 4);
  EXPECT_EQ(UnsentLimitFor(4), kUnsentBudget / 4);
  EXPECT_EQ(UnsentLimitFor(5), kUnsentBudget / 8);
  EXPECT_EQ(UnsentLimitFor(33), kMinUnsentLimit);
  EXPECT_EQ(UnsentLimitFor(64), kMinUnsentLimit);
  EXPECT_EQ(UnsentLimitFor(100000), kMinUnsentLimit);
}

long SocketUnsentLimit(int fd) {
  int value = -1;
  socklen_t length = sizeof(value);
  if (getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, &length) != 0) return -1;
  return value;
}

// kStreams sender QPs on one engine and one send CQ, each bound to a TCP
// socket whose other end (a raw socket) only Drain reads.
class UnsentLimitTest : public ::testing::Test {
 protected:
  static constexpr std::size_t kStreams = 4;
  static constexpr std::uint32_t kSize = 64 * 1024;

  UnsentLimitTest() : src_(kSize) {
    engine_ = Engine::Create(EngineConfig{});
    EXPECT_NE(engine_, nullptr);
    pd_ = engine_->memory().AllocatePd();
    send_cq_ = CompletionQueue::Create(4096, {});
    recv_cq_ = CompletionQueue::Create(64, {});
    src_.Fill(5);
    lkey_ = src_.Register(engine_->memory(), pd_, AccessFlags::kLocalWrite);
    for (std::size_t i = 0; i < kStreams; ++i) {
      QpConfig config;
      config.pd = pd_;
      config.send_cq = send_cq_.get();
      config.recv_cq = recv_cq_.get();
      config.sq_caps = QueueCaps{256, kMaxSge, kMaxInlineData};
      config.rq_caps = QueueCaps{16, kMaxSge, 0};
      std::shared_ptr<Qp> qp = engine_->CreateQp(config);
      EXPECT_NE(qp, nullptr);
      if (qp == nullptr) return;
      EXPECT_EQ(qp->Modify(QpState::kInit), QpStatus::kOk);
      const std::array<int, 2> fds = Connect(Transport::kTcp);
      EXPECT_EQ(qp->Bind(std::make_unique<transport::TcpStream>(fds[0]), StreamParams{}),
                BindStatus::kOk);
      ours_.push_back(fds[0]);  // owned by the QP's stream; looked at only
      peers_.push_back(fds[1]);
      qps_.push_back(std::move(qp));
    }
  }
  ~UnsentLimitTest() override {
    StopDrain();
    for (auto& qp : qps_) qp->Destroy();
    qps_.clear();
    for (int fd : peers_) close(fd);
    // engine_ goes last (the first member): src_ deregisters from it.
  }

  PostStatus PostWrite(std::size_t stream, std::uint64_t wr_id) {
    SendWorkRequest wr = MakeSend(wr_id, SendOpcode::kRdmaWrite);
    AddSge(wr, src_.addr(), kSize, lkey_);
    wr.rkey = 1;  // the raw peer checks nothing
    wr.remote_addr = 0;
    return qps_[stream]->PostSend(wr);
  }

  // Reads and drops everything the peers get, until StopDrain.
  void StartDrain() {
    drain_ = std::thread([this] {
      std::vector<std::uint8_t> sink(256 * 1024);
      while (!stop_drain_.load()) {
        std::vector<pollfd> fds;
        for (int fd : peers_) fds.push_back(pollfd{fd, POLLIN, 0});
        if (poll(fds.data(), fds.size(), 10) <= 0) continue;
        for (const pollfd& p : fds) {
          if ((p.revents & POLLIN) != 0) {
            const ssize_t n = recv(p.fd, sink.data(), sink.size(), MSG_DONTWAIT);
            if (n > 0) drained_.fetch_add(static_cast<std::uint64_t>(n));
          }
        }
        // In bursts, if asked: the sockets fill between them.
        if (drain_pause_.count() > 0) std::this_thread::sleep_for(drain_pause_);
      }
    });
  }
  void StopDrain() {
    stop_drain_.store(true);
    if (drain_.joinable()) drain_.join();
  }

  // Posts `writes` Writes to each of the first `streams` streams, with a
  // poll after every post (so each transmits at once), then polls until
  // that many streams wait on a full socket; adds what the polls completed
  // to `completed`.
  ::testing::AssertionResult FillSockets(std::size_t streams, std::uint64_t writes,
                                         std::size_t& completed) {
    std::array<WorkCompletion, 64> batch;
    for (std::size_t i = 0; i < streams; ++i) {
      for (std::uint64_t w = 0; w < writes; ++w) {
        if (PostWrite(i, i * writes + w) != PostStatus::kOk) {
          return ::testing::AssertionFailure() << "Write " << w << " to stream " << i;
        }
        completed += send_cq_->Poll(batch);
      }
    }
    if (!WaitUntil([&] {
          completed += send_cq_->Poll(batch);
          return engine_->tx_blocked_streams() == streams;
        })) {
      return ::testing::AssertionFailure() << "not every socket filled";
    }
    return ::testing::AssertionSuccess();
  }

  // Once the peers read: the rest of Writes 0..total-1 complete, each
  // successfully, no stream is left waiting, and every payload octet (with
  // the framing around it) reaches the peers.
  void ExpectEveryWriteDone(std::uint64_t total, std::size_t completed) {
    const std::vector<WorkCompletion> rest = WaitCompletions(*send_cq_, total - completed);
    EXPECT_EQ(completed + rest.size(), total);
    for (const WorkCompletion& wc : rest) EXPECT_EQ(wc.status, WcStatus::kSuccess);
    EXPECT_TRUE(WaitUntil([&] { return engine_->tx_blocked_streams() == 0; }));
    const std::uint64_t payload = total * kSize;
    EXPECT_TRUE(WaitUntil([&] { return drained_.load() >= payload; }))
        << drained_.load() << " octets reached the peers, " << payload << " of payload sent";
  }

  // Two application threads transmit inline (a poll after every post, so no
  // post waits for the next) on all the streams, whose peers read in bursts
  // `pause` apart, while the progress thread pumps on EPOLLOUT: every Write
  // completes exactly once and no stream is left waiting. Records how often
  // EPOLLOUT found the transmit side owned and how many posts were left to
  // EPOLLOUT.
  void RunInlineTransmitters(std::chrono::microseconds pause);

  // One application thread posts Writes to all the streams and polls their
  // CQ with progress (perftest's -q loop), the CQ's polls waiting up to
  // `poll_wait` when empty, while the peers read in bursts so that sockets
  // fill and then become writable together. Every Write must complete
  // exactly once, and the poller must have taken some of the progress
  // thread's transmit turns (Engine::HelpTransmit). Stops posting once it
  // has; posts at most kStreams x 2,000 Writes (500 MiB).
  void RunHelpedStreams(std::chrono::microseconds poll_wait);

  std::unique_ptr<Engine> engine_;
  PdId pd_ = kNoPd;
  std::unique_ptr<CompletionQueue> send_cq_;
  std::unique_ptr<CompletionQueue> recv_cq_;
  Buffer src_;
  std::uint32_t lkey_ = 0;
  std::vector<std::shared_ptr<Qp>> qps_;
  std::vector<int> ours_;
  std::vector<int> peers_;
  std::thread drain_;
  std::atomic<bool> stop_drain_{false};
  std::chrono::microseconds drain_pause_{0};  // set before StartDrain
  std::atomic<std::uint64_t> drained_{0};
};

// Streams fill one after the other: the first waits alone and keeps the
// system's default, each later one gets the share for the streams waiting
// when its socket was found full; once the peers read, every Write
// completes and no stream counts as waiting any more.
TEST_F(UnsentLimitTest, EachStreamFoundFullGetsItsShareAndEveryWriteCompletes) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWrites = 200;  // 12.5 MiB: more than both socket buffers
  std::size_t completed = 0;
  std::array<WorkCompletion, 64> batch;
  for (std::size_t i = 0; i < kStreams; ++i) {
    for (std::uint64_t w = 0; w < kWrites; ++w) {
      ASSERT_EQ(PostWrite(i, i * kWrites + w), PostStatus::kOk);
      completed += send_cq_->Poll(batch);  // transmits coalesced posts
    }
    ASSERT_TRUE(WaitUntil([&] {
      completed += send_cq_->Poll(batch);
      return engine_->tx_blocked_streams() == i + 1;
    })) << "stream " << i << " never found its socket full";
    EXPECT_EQ(qps_[i]->unsent_limit(), UnsentLimitFor(i + 1)) << "stream " << i;
    EXPECT_EQ(SocketUnsentLimit(ours_[i]), static_cast<long>(UnsentLimitFor(i + 1)));
  }
  EXPECT_EQ(qps_[0]->unsent_limit(), 0u);
  EXPECT_EQ(qps_[kStreams - 1]->unsent_limit(), kUnsentBudget / 4);
  EXPECT_LT(completed, kStreams * kWrites);

  StartDrain();
  ExpectEveryWriteDone(kStreams * kWrites, completed);
}

// A socket found full has its write interest armed; when it drains while an
// application thread owns the QP's transmit side (transmitting inline), the
// progress thread's EPOLLOUT wake-up can do nothing but leave a kick for
// that owner. It takes the interest off, so level-triggered EPOLLOUT does
// not wake it over and over until the owner is done: one wake-up, however
// long the owner holds on (performance-notes 3.19; before, the count here
// grew by thousands). The owner's release pumps, every Write completes once
// and every octet framed reaches the peers.
TEST_F(UnsentLimitTest, EpollOutWhileTheApplicationOwnsTransmitWakesTheProgressThreadOnce) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWrites = 200;  // 12.5 MiB a stream: its socket fills
  std::size_t completed = 0;
  ASSERT_TRUE(FillSockets(kStreams, kWrites, completed));
  const std::uint64_t wakes_before = qps_[0]->tx_wakes_owned();
  qps_[0]->HoldTxGateForTest();
  StartDrain();  // the peers start reading only now
  ASSERT_TRUE(WaitUntil([&] { return qps_[0]->tx_wakes_owned() > wakes_before; }))
      << "stream 0 drained but EPOLLOUT never reached the progress thread";
  // Without the interest taken off, a writable socket wakes it again at once.
  WaitUntil([&] { return qps_[0]->tx_wakes_owned() > wakes_before + 1; },
            std::chrono::milliseconds(100));
  EXPECT_EQ(qps_[0]->tx_wakes_owned(), wakes_before + 1);
  qps_[0]->ReleaseTxGateForTest();  // the kick left behind pumps here
  ExpectEveryWriteDone(kStreams * kWrites, completed);
}

// A post to a stream whose socket is known full (write interest armed)
// while other streams wait too does not call sendmsg from the application
// thread, which could only find the socket full again (93 % of them did
// under load with 64 QPs, performance-notes 3.19, 3.20): EPOLLOUT pumps
// what it added once the peer reads. Every Write still completes exactly
// once and every payload octet reaches the peers.
TEST_F(UnsentLimitTest, PostsToAFullSocketWhileOthersWaitAreLeftToEpollOut) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWrites = 200;  // 12.5 MiB a stream: its socket fills
  constexpr std::uint64_t kMore = 16;     // posted to stream 0 once all are full
  std::size_t completed = 0;
  ASSERT_TRUE(FillSockets(kStreams, kWrites, completed));
  std::array<WorkCompletion, 64> batch;
  const QpCounters before = qps_[0]->Counters();
  const std::uint64_t left_before = qps_[0]->tx_kicks_left_to_epollout();
  for (std::uint64_t w = 0; w < kMore; ++w) {
    ASSERT_EQ(PostWrite(0, kStreams * kWrites + w), PostStatus::kOk);
    completed += send_cq_->Poll(batch);  // so the next post transmits at once
  }
  const QpCounters after = qps_[0]->Counters();
  EXPECT_EQ(qps_[0]->tx_kicks_left_to_epollout(), left_before + kMore);
  EXPECT_EQ(after.tx_would_block, before.tx_would_block) << "sendmsg into the full socket";
  EXPECT_EQ(after.tx_syscalls, before.tx_syscalls);

  StartDrain();
  ExpectEveryWriteDone(kStreams * kWrites + kMore, completed);
}

// A stream that waits alone (one QP: ib_write_bw -q 1) keeps transmitting
// from the application thread: its progress thread must not become the
// sender of a single stream. Each post therefore calls sendmsg, which finds
// the socket full. A round in which another thread held the transmit gate
// is not judged: the progress thread takes it for an EPOLLOUT (the peer's
// ACKs free room) or for the next turn of a pump whose budget ran out, and
// then pumps for the posts that find it held; under load it may be
// preempted while it holds the gate, for all the posts of a round.
TEST_F(UnsentLimitTest, PostsToAStreamThatWaitsAloneStillTransmitInline) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWrites = 200;
  constexpr std::uint64_t kMore = 16;   // posts a round
  constexpr std::uint64_t kRounds = 3;  // 200 + 3 x 16 fit the SQ of 256
  std::size_t completed = 0;
  ASSERT_TRUE(FillSockets(1, kWrites, completed));
  std::array<WorkCompletion, 64> batch;
  Qp& qp = *qps_[0];
  std::uint64_t posted = kWrites;
  bool judged = false;
  for (std::uint64_t round = 0; round < kRounds && !judged; ++round) {
    // Waits out a thread that holds the gate; what it left pumps here.
    qp.HoldTxGateForTest();
    qp.ReleaseTxGateForTest();
    const QpCounters before = qp.Counters();
    const std::uint64_t to_owner_before = qp.tx_kicks_to_owner();
    const std::uint64_t to_poll_before = qp.tx_kicks_left_to_poll();
    for (std::uint64_t w = 0; w < kMore; ++w) {
      ASSERT_EQ(PostWrite(0, posted++), PostStatus::kOk);
      completed += send_cq_->Poll(batch);
    }
    if (qp.tx_kicks_to_owner() != to_owner_before ||
        qp.tx_kicks_left_to_poll() != to_poll_before) {
      continue;
    }
    judged = true;
    EXPECT_GE(qp.Counters().tx_would_block, before.tx_would_block + kMore);
  }
  EXPECT_TRUE(judged) << "another thread held the transmit gate in each of " << kRounds
                      << " rounds: the progress thread is the sender of this stream";
  EXPECT_EQ(qp.tx_kicks_left_to_epollout(), 0u);

  StartDrain();
  ExpectEveryWriteDone(posted, completed);
}

// A post to a QP alone on its send CQ (ib_write_bw -q 1) that finds the
// progress thread pumping its stream (here: held inside the turn EPOLLOUT
// gave it once the peer read) adds no kick for that thread to pump, so it
// does not stay the sender while the application spins in its polls
// (performance-notes 3.38): the post's transmit is owed to the next poll,
// which finds the gate free and sends on the polling thread. Every Write
// completes exactly once. An application that armed its CQ polls no more,
// so its post kicks the owner as before.
TEST_F(UnsentLimitTest, PostsWhileTheProgressThreadPumpsAreLeftToTheNextPoll) {
  ASSERT_EQ(qps_.size(), kStreams);
  for (std::size_t i = 1; i < kStreams; ++i) qps_[i]->Destroy();  // one QP on the CQ
  qps_.resize(1);
  constexpr std::uint64_t kWrites = 200;  // 12.5 MiB: the socket fills
  constexpr std::uint64_t kMore = 8;
  std::size_t completed = 0;
  ASSERT_TRUE(FillSockets(1, kWrites, completed));
  Qp& qp = *qps_[0];
  std::mutex mutex;
  std::condition_variable cv;
  bool held = false;
  bool release = false;
  const std::function<void()> hook = [&] {
    std::unique_lock lock(mutex);
    if (release) return;
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  qp.SetProgressPumpHookForTest(&hook);
  // However the test ends (an ASSERT returns early too): let the hook go,
  // then wait until no pump can be inside it (it runs with the gate held,
  // and a pump that starts after the reset sees no hook).
  struct HookReset {
    Qp& qp;
    std::mutex& mutex;
    std::condition_variable& cv;
    bool& release;
    ~HookReset() {
      {
        std::lock_guard lock(mutex);
        release = true;
      }
      cv.notify_all();
      qp.SetProgressPumpHookForTest(nullptr);
      qp.HoldTxGateForTest();
      qp.ReleaseTxGateForTest();
    }
  } reset{qp, mutex, cv, release};
  StartDrain();  // EPOLLOUT: the progress thread pumps, and stops in the hook
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return held; }))
        << "the progress thread never pumped this stream";
  }
  const std::uint64_t to_owner_before = qp.tx_kicks_to_owner();
  std::uint64_t posted = kWrites;
  std::array<WorkCompletion, 64> batch;
  // A poll after each post, as perftest's loop does (back-to-back posts
  // would wait for the poll anyway: coalescing); each post and each poll's
  // flush finds the progress thread pumping.
  for (std::uint64_t w = 0; w < kMore; ++w) {
    ASSERT_EQ(PostWrite(0, posted++), PostStatus::kOk);
    completed += send_cq_->Poll(batch);
  }
  const std::uint64_t left_to_poll = qp.tx_kicks_left_to_poll();
  EXPECT_GE(left_to_poll, kMore);
  EXPECT_EQ(qp.tx_kicks_to_owner(), to_owner_before);
  // Armed: the application sleeps on its completion channel instead (the
  // arm itself kicks for what the posts above left owed).
  send_cq_->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(qp.tx_kicks_to_owner(), to_owner_before + 1);
  ASSERT_EQ(PostWrite(0, posted++), PostStatus::kOk);
  EXPECT_EQ(qp.tx_kicks_left_to_poll(), left_to_poll);
  EXPECT_EQ(qp.tx_kicks_to_owner(), to_owner_before + 2);
  send_cq_->Arm(CqArm::kNone);
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  cv.notify_all();
  ExpectEveryWriteDone(posted, completed);
}

// The completions of Writes numbered 0..total-1 that several threads poll:
// each must come once, successful, and all of them must come.
struct WriteTally {
  explicit WriteTally(std::uint64_t total) : seen(total) {}

  void Take(std::span<const WorkCompletion> batch) {
    for (const WorkCompletion& wc : batch) {
      if (wc.status != WcStatus::kSuccess || wc.wr_id >= seen.size()) {
        failed.store(true);
        continue;
      }
      seen[wc.wr_id].fetch_add(1);
    }
    completed.fetch_add(batch.size());
  }
  bool AllIn() const { return completed.load() >= seen.size(); }
  void ExpectEachOnce() const {
    EXPECT_FALSE(failed.load());
    EXPECT_EQ(completed.load(), seen.size());
    for (std::uint64_t id = 0; id < seen.size(); ++id) {
      EXPECT_EQ(seen[id].load(), 1) << "wr " << id;
    }
  }

  std::vector<std::atomic<int>> seen;
  std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> failed{false};
};

void UnsentLimitTest::RunInlineTransmitters(std::chrono::microseconds pause) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWritesPerStream = 400;
  constexpr std::uint64_t kTotal = kStreams * kWritesPerStream;
  WriteTally tally(kTotal);
  drain_pause_ = pause;
  StartDrain();
  auto transmitter = [&](std::size_t first_stream) {
    std::array<std::uint64_t, kStreams> posted{};
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    while (!tally.AllIn() && Clock::now() < deadline) {
      for (std::size_t i = first_stream; i < kStreams; i += 2) {
        if (posted[i] < kWritesPerStream) {
          const PostStatus status = PostWrite(i, i * kWritesPerStream + posted[i]);
          if (status == PostStatus::kOk) {
            ++posted[i];
          } else if (status != PostStatus::kQueueFull) {
            tally.failed.store(true);
          }
        }
        // A poll after every post: the next post transmits at once, inline.
        const std::size_t got = send_cq_->Poll(batch);
        tally.Take(std::span(batch).first(got));
      }
    }
  };
  std::thread first(transmitter, 0);
  std::thread second(transmitter, 1);
  first.join();
  second.join();
  tally.ExpectEachOnce();
  EXPECT_TRUE(WaitUntil([&] { return engine_->tx_blocked_streams() == 0; }));
  std::uint64_t owned = 0;
  std::uint64_t left = 0;
  for (const auto& qp : qps_) {
    owned += qp->tx_wakes_owned();
    left += qp->tx_kicks_left_to_epollout();
  }
  RecordProperty("epollout_while_owned", static_cast<int>(owned));
  RecordProperty("kicks_left_to_epollout", static_cast<int>(left));
}

void UnsentLimitTest::RunHelpedStreams(std::chrono::microseconds poll_wait) {
  ASSERT_EQ(qps_.size(), kStreams);
  // Writes go on until the poller took a turn (or kWait passed): on a
  // loaded machine 2,000 per stream once went by without one, the poller
  // off its CPU through every share.
  constexpr std::uint64_t kMaxWritesPerStream = 100000;
  WriteTally tally(kStreams * kMaxWritesPerStream);
  send_cq_->set_poll_wait(poll_wait);
  drain_pause_ = std::chrono::microseconds(2000);
  StartDrain();
  std::array<std::uint64_t, kStreams> posted{};
  std::uint64_t total = 0;
  std::array<WorkCompletion, 16> batch;
  const auto deadline = Clock::now() + kWait;
  bool helped = false;
  while (Clock::now() < deadline) {
    helped = engine_->transmit_turns_helped() > 0;
    if (!helped) {
      for (std::size_t i = 0; i < kStreams; ++i) {
        for (int k = 0; k < 8 && posted[i] < kMaxWritesPerStream; ++k) {
          const PostStatus status = PostWrite(i, i * kMaxWritesPerStream + posted[i]);
          if (status == PostStatus::kQueueFull) break;
          if (status != PostStatus::kOk) tally.failed.store(true);
          ++posted[i];
          ++total;
        }
      }
    }
    const std::size_t got = send_cq_->PollWithProgress(batch);
    tally.Take(std::span(batch).first(got));
    const bool all_posted = std::all_of(posted.begin(), posted.end(),
                                        [](std::uint64_t p) { return p == kMaxWritesPerStream; });
    if ((helped || all_posted) && tally.completed.load() == total) break;
  }
  EXPECT_TRUE(helped) << "the poller took none of the progress thread's transmit turns in "
                      << total << " Writes";
  EXPECT_FALSE(tally.failed.load());
  ASSERT_EQ(tally.completed.load(), total) << "of the Writes posted";
  for (std::size_t i = 0; i < kStreams; ++i) {
    for (std::uint64_t w = 0; w < posted[i]; ++w) {
      EXPECT_EQ(tally.seen[i * kMaxWritesPerStream + w].load(), 1) << "stream " << i << " wr " << w;
    }
  }
  EXPECT_TRUE(WaitUntil([&] { return engine_->tx_blocked_streams() == 0; }));
  const std::uint64_t payload = total * kSize;
  EXPECT_TRUE(WaitUntil([&] { return drained_.load() >= payload; }))
      << drained_.load() << " octets reached the peers, " << payload << " of payload sent";
  RecordProperty("transmit_turns_helped", static_cast<int>(engine_->transmit_turns_helped()));
}

// With several streams waiting for their peers, a wake-up of the progress
// thread finds several sockets writable at once. It shares those transmit
// turns with the application thread that polls the streams' CQ empty, so
// that ib_write_bw -q 64's sender is two threads on two CPUs, not the one
// progress thread with the other CPU partly idle (performance-notes 3.36).
// Helpers and the progress thread race over the turns and the QPs' transmit
// gates: every Write completes exactly once (also under TSan).
TEST_F(UnsentLimitTest, APollingThreadTakesTransmitTurnsOfWritableSockets) {
  RunHelpedStreams(std::chrono::microseconds(0));
}

// The same with a poller that sleeps in its empty polls (SIWX_POLL_WAIT_US):
// it still takes turns, woken to help or by a completion (that the wake-up
// itself ends the wait is CompletionQueuePollWait's test).
TEST_F(UnsentLimitTest, APollerSleepingInItsPollIsWokenToTakeTransmitTurns) {
  RunHelpedStreams(std::chrono::microseconds(5000));
}

// Two application threads post and poll the one CQ of all the streams (as
// perftest's -q does) while the progress thread transmits on EPOLLOUT and
// the peers read in bursts, so sockets fill and drain over and over: every
// Write completes exactly once, and when all is sent no stream counts as
// waiting (the count went up and down once per change, under TSan too).
TEST_F(UnsentLimitTest, PostersPollersAndTheProgressThreadRaceOnManyStreams) {
  ASSERT_EQ(qps_.size(), kStreams);
  constexpr std::uint64_t kWritesPerStream = 300;
  constexpr std::uint64_t kTotal = kStreams * kWritesPerStream;
  WriteTally tally(kTotal);
  StartDrain();
  auto poster = [&](std::size_t first_stream) {
    std::array<std::uint64_t, kStreams> posted{};
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    while (!tally.AllIn() && Clock::now() < deadline) {
      for (std::size_t i = first_stream; i < kStreams; i += 2) {
        // Up to 8 back to back per stream, as long as its SQ has room.
        for (int k = 0; k < 8 && posted[i] < kWritesPerStream; ++k) {
          const std::uint64_t id = i * kWritesPerStream + posted[i];
          const PostStatus status = PostWrite(i, id);
          if (status == PostStatus::kQueueFull) break;
          if (status != PostStatus::kOk) tally.failed.store(true);
          ++posted[i];
        }
      }
      const std::size_t got = send_cq_->PollWithProgress(batch);
      tally.Take(std::span(batch).first(got));
    }
  };
  std::thread first(poster, 0);
  std::thread second(poster, 1);
  first.join();
  second.join();
  tally.ExpectEachOnce();
  EXPECT_TRUE(WaitUntil([&] { return engine_->tx_blocked_streams() == 0; }));
  // How often EPOLLOUT met an inline transmitter here (it took the write
  // interest off and left the pump to that thread): for the record only.
  std::uint64_t owned = 0;
  for (const auto& qp : qps_) owned += qp->tx_wakes_owned();
  RecordProperty("epollout_while_owned", static_cast<int>(owned));
}

// Two application threads transmit inline (a poll after every post, so no
// post waits for the next) on all the streams, whose peers read in bursts
// `pause` apart, while the progress thread pumps on EPOLLOUT: every Write
// must complete exactly once and nothing may be left waiting. Records how
// often each of the two races below happened.
// The race of the change above: application threads transmit inline (a poll
// between posts, so no post waits for the next) on streams whose peers read
// in bursts, while the progress thread's EPOLLOUT wake-ups find the
// transmit side owned and take the write interest off as the owners arm it
// again. No wake-up may be lost (every Write completes, exactly once, and
// nothing is left waiting), also under TSan.
TEST_F(UnsentLimitTest, InlineTransmittersAndEpollOutWakeUpsRaceOverTheWriteInterest) {
  RunInlineTransmitters(std::chrono::microseconds(300));
}

// The same with longer pauses between the peers' reads, so that several
// sockets stay full at once and posts are left to EPOLLOUT
// (KickTxFromApplication) while the progress thread pumps those QPs and
// takes their write interest off: no post may be stranded.
TEST_F(UnsentLimitTest, PostsLeftToEpollOutRaceWithTheProgressThreadsPumps) {
  RunInlineTransmitters(std::chrono::microseconds(3000));
}

}  // namespace
}  // namespace siwx::engine::testing
