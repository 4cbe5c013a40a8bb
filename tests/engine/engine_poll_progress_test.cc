// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Progress driven by an application thread polling a CQ empty
// (CompletionQueue::PollWithProgress -> Qp::DriveFromPoll): receive
// completions and Read completions (send CQ) arrive while the progress
// thread cannot run; every message is processed exactly once and in order
// when pollers of both CQs, posting threads and the progress thread race on
// one QP; and Destroy and a peer's close are safe while another thread
// polls. A polling application holds the QP's read lease (read interest off
// the poller); progress goes back to the progress thread when it stops
// polling or arms the CQ.
#include <sys/epoll.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

// One more QP of b's engine, on b's CQs, connected over TCP to a new node on
// `peer_engine`: one more driver of b's CQs.
struct ExtraQpOnTheCqs {
  ExtraQpOnTheCqs(Node& b, Engine* peer_engine) : peer(NodeOptions{}, peer_engine) {
    QpConfig config;
    config.pd = b.pd;
    config.send_cq = b.send_cq.get();
    config.recv_cq = b.recv_cq.get();
    config.sq_caps = QueueCaps{16, kMaxSge, kMaxInlineData};
    config.rq_caps = QueueCaps{16, kMaxSge, 0};
    qp = b.engine->CreateQp(config);
    EXPECT_NE(qp, nullptr);
    EXPECT_EQ(qp->Modify(QpState::kInit), QpStatus::kOk);
    const std::array<int, 2> fds = Connect(Transport::kTcp);
    peer.Bind(fds[0], StreamParams{});
    EXPECT_EQ(qp->Bind(std::make_unique<transport::TcpStream>(fds[1]), StreamParams{}),
              BindStatus::kOk);
  }
  ~ExtraQpOnTheCqs() {
    if (qp) qp->Destroy();
  }
  Node peer;
  std::shared_ptr<Qp> qp;
};

class PollProgressTest : public ::testing::Test {
 protected:
  // PostersPollersAndProgressThreadRaceOnOneQp's body, with every CQ's
  // bounded wait at `poll_wait` (zero: polls never sleep).
  void RunPostersPollersRace(std::chrono::microseconds poll_wait);
  // Links a_ and b_ over TCP, posts 4 receives at b (into lease_rbuf_) and
  // completes a Send from a through b's driving poll: b holds its read lease.
  void LinkWithBLeased() {
    Link(a_, b_, Transport::kTcp, {});
    const std::uint32_t key =
        lease_rbuf_.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
    for (std::uint64_t id = 0; id < 4; ++id) PostRecv(b_, id, lease_rbuf_, key);
    ASSERT_EQ(a_.qp->PostSend(MakeSend(0, SendOpcode::kSend)), PostStatus::kOk);
    ASSERT_EQ(PollProgressFor(*b_.recv_cq, 1).size(), 1u);
  }

  Node a_;
  Node b_;
  Buffer lease_rbuf_{64};
};

TEST_F(PollProgressTest, SendCompletesThroughPollWhileTheProgressThreadIsHeld) {
  Link(a_, b_, Transport::kTcp, {});
  ProgressThreadBlocker blocker(b_, a_.engine);
  ASSERT_TRUE(blocker.Block());

  Buffer rbuf(64);
  PostRecv(b_, 7, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  Buffer src(40);
  src.Fill(3);
  SendWorkRequest wr = MakeSend(8, SendOpcode::kSend);
  AddSge(wr, src.addr(), 40, src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite));
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);

  const auto wc = PollProgressFor(*b_.recv_cq, 1);
  // Still held: the completion can only have come from the polling thread.
  EXPECT_TRUE(blocker.blocked());
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(wc[0].byte_len, 40u);
  EXPECT_TRUE(SameBytes(rbuf.data(), src.data(), 40));
  EXPECT_TRUE(rbuf.GuardsIntact());
}

TEST_F(PollProgressTest, ReadCompletesThroughSendCqPollWhileTheProgressThreadIsHeld) {
  Link(a_, b_, Transport::kTcp, {});
  ProgressThreadBlocker blocker(a_, b_.engine);
  ASSERT_TRUE(blocker.Block());

  Buffer source(3000);
  source.Fill(9);
  const std::uint32_t rkey = source.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer sink(3000);
  SendWorkRequest read = MakeSend(21, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), 3000, sink.Register(a_.memory(), a_.pd, kAllRemote));
  read.rkey = rkey;
  read.remote_addr = source.addr();
  ASSERT_EQ(a_.qp->PostSend(read), PostStatus::kOk);

  const auto wc = PollProgressFor(*a_.send_cq, 1);
  // Still held: the Read Response was placed by the polling thread.
  EXPECT_TRUE(blocker.blocked());
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_TRUE(SameBytes(sink.data(), source.data(), 3000));
  EXPECT_TRUE(sink.GuardsIntact());
}

// A bulk Read requester (Qp::kBulkReads or more Reads outstanding, nothing
// left to send) alone on its send CQ sleeps in poll(2) on its socket while
// the socket is empty, instead of spinning on it (Qp::WaitForInput;
// docs/performance-notes.md 3.39), and reads the responses itself once they
// come. b's progress thread is held, so no response comes while a polls.
// Released, every Read completes once, in order, with its data. A Read
// ping-pong (one outstanding) never sleeps on its socket.
TEST_F(PollProgressTest, BulkReadRequesterSleepsOnItsSocketAndLosesNothing) {
  Link(a_, b_, Transport::kTcp, {});  // ORD 8
  a_.send_cq->set_poll_wait(std::chrono::microseconds(200));
  constexpr std::uint64_t kReads = 10;  // two of them wait for an ORD slot
  constexpr std::uint32_t kSize = 3000;
  Buffer source(kReads * kSize);
  source.Fill(5);
  const std::uint32_t rkey = source.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer sink(kReads * kSize);
  const std::uint32_t sink_key = sink.Register(a_.memory(), a_.pd, kAllRemote);
  auto post_read = [&](std::uint64_t i) {
    SendWorkRequest read = MakeSend(100 + i, SendOpcode::kRdmaRead);
    AddSge(read, sink.addr() + i * kSize, kSize, sink_key);
    read.rkey = rkey;
    read.remote_addr = source.addr() + i * kSize;
    ASSERT_EQ(a_.qp->PostSend(read), PostStatus::kOk);
  };
  std::array<WorkCompletion, 16> batch;

  ProgressThreadBlocker ping_blocker(b_, a_.engine);
  ASSERT_TRUE(ping_blocker.Block());
  post_read(0);
  const std::uint64_t ping_input_waits = a_.send_cq->input_waits();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(a_.send_cq->PollWithProgress(batch), 0u);
  EXPECT_EQ(a_.send_cq->input_waits(), ping_input_waits);
  ping_blocker.Release();
  auto wc = PollProgressFor(*a_.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 100u);

  ProgressThreadBlocker bulk_blocker(b_, a_.engine);
  ASSERT_TRUE(bulk_blocker.Block());
  for (std::uint64_t i = 1; i < kReads; ++i) post_read(i);
  const std::uint64_t input_waits = a_.send_cq->input_waits();
  // The first polls may come within Qp::kInputGapBeforeWait of the last
  // input; then each empty poll is one sleep.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (a_.send_cq->input_waits() < input_waits + 3 &&
         std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(a_.send_cq->PollWithProgress(batch), 0u);
  }
  EXPECT_GE(a_.send_cq->input_waits(), input_waits + 3);
  EXPECT_TRUE(bulk_blocker.blocked());
  bulk_blocker.Release();
  wc = PollProgressFor(*a_.send_cq, kReads - 1);
  ASSERT_EQ(wc.size(), kReads - 1);
  for (std::uint64_t i = 0; i < kReads - 1; ++i) {
    EXPECT_EQ(wc[i].wr_id, 101 + i);
    EXPECT_EQ(wc[i].status, WcStatus::kSuccess);
    EXPECT_EQ(wc[i].opcode, WcOpcode::kRdmaRead);
  }
  EXPECT_TRUE(SameBytes(sink.data(), source.data(), kReads * kSize));
  EXPECT_TRUE(sink.GuardsIntact());
  EXPECT_EQ(a_.send_cq->PollWithProgress(batch), 0u);  // nothing twice
}

// Two application threads on a's QP race with each other and with a's
// progress thread: one posts Writes, Reads and Sends and polls the send CQ
// with progress, the other polls the receive CQ with progress for b's
// Sends. Every WR completes once, in order, with its data.
TEST_F(PollProgressTest, PostersPollersAndProgressThreadRaceOnOneQp) {
  RunPostersPollersRace(std::chrono::microseconds(0));
}

// The same race with polls that may sleep (SIWX_POLL_WAIT_US): nothing is
// lost, duplicated or reordered by a wait and the pushes that end it.
TEST_F(PollProgressTest, PostersPollersAndProgressThreadRaceWithPollWait) {
  RunPostersPollersRace(std::chrono::microseconds(50));
}

void PollProgressTest::RunPostersPollersRace(std::chrono::microseconds poll_wait) {
  Link(a_, b_, Transport::kTcp, {});
  for (CompletionQueue* cq : {a_.send_cq.get(), a_.recv_cq.get(), b_.recv_cq.get()}) {
    cq->set_poll_wait(poll_wait);
  }
  constexpr std::size_t kOps = 600;
  constexpr std::size_t kMaxSize = 6000;
  constexpr std::size_t kWindow = 32;
  auto size_of = [](std::size_t i) { return 1 + (i * 977) % kMaxSize; };

  Buffer local(kWindow * kMaxSize);
  const std::uint32_t lkey = local.Register(a_.memory(), a_.pd, kAllRemote);
  Buffer remote(kWindow * kMaxSize);
  remote.Fill(6);
  const std::uint32_t rkey = remote.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer a_recv(kWindow * 64);
  const std::uint32_t a_recv_key = a_recv.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  Buffer b_recv(kWindow * kMaxSize);
  const std::uint32_t b_recv_key = b_recv.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  // b receives a's Sends, one in three of kOps.
  for (std::uint64_t id = 0; id < kOps / 3; ++id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, b_recv.addr() + (id % kWindow) * kMaxSize, kMaxSize, b_recv_key);
    ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);
  }
  for (std::uint64_t id = 0; id < kWindow; ++id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, a_recv.addr() + id * 64, 64, a_recv_key);
    ASSERT_EQ(a_.qp->PostRecv(rwr), PostStatus::kOk);
  }
  constexpr std::size_t kPeerSends = 200;

  std::atomic<bool> failed{false};
  std::atomic<std::size_t> a_received{0};
  std::thread receiver([&] {
    // a's receive CQ: b's Sends, reposted as they complete.
    std::size_t received = 0;
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    while (received < kPeerSends && Clock::now() < deadline) {
      const std::size_t got = a_.recv_cq->PollWithProgress(batch);
      for (std::size_t i = 0; i < got; ++i) {
        if (batch[i].wr_id != received % kWindow || batch[i].status != WcStatus::kSuccess ||
            batch[i].byte_len != received % 64) {
          failed = true;
        }
        ReceiveWorkRequest rwr;
        rwr.wr_id = batch[i].wr_id;
        AddSge(rwr, a_recv.addr() + batch[i].wr_id * 64, 64, a_recv_key);
        if (received + kWindow < kPeerSends && a_.qp->PostRecv(rwr) != PostStatus::kOk) {
          failed = true;
        }
        ++received;
        a_received.store(received);
      }
    }
    if (received != kPeerSends) failed = true;
  });
  std::thread peer([&] {
    for (std::size_t i = 0; i < kPeerSends && !failed.load(); ++i) {
      // Never more in flight than a has receives posted for.
      const auto deadline = Clock::now() + kWait;
      while (i >= a_received.load() + kWindow && Clock::now() < deadline) {
        std::this_thread::yield();
      }
      SendWorkRequest wr = MakeSend(i, SendOpcode::kSend, kSendInline);
      wr.inline_length = static_cast<std::uint32_t>(i % 64);
      std::fill(wr.inline_data.begin(), wr.inline_data.begin() + wr.inline_length,
                static_cast<std::uint8_t>(i));
      while (b_.qp->PostSend(wr) == PostStatus::kQueueFull) std::this_thread::yield();
    }
  });

  // This thread: a's poster and send-CQ poller.
  std::size_t posted = 0;
  std::size_t completed = 0;
  std::array<WorkCompletion, 16> batch;
  const auto deadline = Clock::now() + kWait;
  while (completed < kOps && Clock::now() < deadline) {
    if (posted < kOps && posted - completed < kWindow) {
      const std::size_t slot = posted % kWindow;
      const std::size_t size = size_of(posted);
      SendWorkRequest wr;
      switch (posted % 3) {
        case 0:  // Write a's slot into b's slot
          wr = MakeSend(posted, SendOpcode::kRdmaWrite);
          wr.rkey = rkey;
          wr.remote_addr = remote.addr() + slot * kMaxSize;
          break;
        case 1:  // Read b's slot into a's slot
          wr = MakeSend(posted, SendOpcode::kRdmaRead);
          wr.rkey = rkey;
          wr.remote_addr = remote.addr() + slot * kMaxSize;
          break;
        default:
          wr = MakeSend(posted, SendOpcode::kSend);
          break;
      }
      AddSge(wr, local.addr() + slot * kMaxSize, static_cast<std::uint32_t>(size), lkey);
      ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
      ++posted;
    }
    const std::size_t got = a_.send_cq->PollWithProgress(batch);
    for (std::size_t i = 0; i < got; ++i) {
      if (batch[i].wr_id != completed || batch[i].status != WcStatus::kSuccess) failed = true;
      ++completed;
    }
  }
  peer.join();
  receiver.join();
  EXPECT_EQ(completed, kOps);
  EXPECT_FALSE(failed.load());
  const auto b_wc = WaitCompletions(*b_.recv_cq, kOps / 3);
  ASSERT_EQ(b_wc.size(), kOps / 3);
  for (std::size_t i = 0; i < b_wc.size(); ++i) {
    EXPECT_EQ(b_wc[i].wr_id, i);
    EXPECT_EQ(b_wc[i].byte_len, size_of(3 * i + 2));
  }
  EXPECT_TRUE(StaysEmpty(*a_.send_cq, std::chrono::milliseconds(20)));
  EXPECT_EQ(a_.qp->Counters().rx_fpdus, b_.qp->Counters().tx_fpdus);
  EXPECT_EQ(b_.qp->Counters().rx_fpdus, a_.qp->Counters().tx_fpdus);
}

TEST_F(PollProgressTest, PollerAndProgressThreadTogetherCompleteEveryMessageOnceInOrder) {
  Link(a_, b_, Transport::kTcp, {});
  constexpr std::size_t kMessages = 2000;
  constexpr std::size_t kMaxSize = 9000;  // several FPDUs for the larger ones
  constexpr std::size_t kWindow = 128;
  Buffer rbufs(kWindow * kMaxSize);
  const std::uint32_t rkey = rbufs.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  auto post_slot = [&](std::uint64_t id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, rbufs.addr() + (id % kWindow) * kMaxSize, kMaxSize, rkey);
    ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);
  };
  for (std::uint64_t id = 0; id < kWindow; ++id) post_slot(id);
  Buffer src(kMaxSize);
  src.Fill(5);
  const std::uint32_t skey = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  auto size_of = [](std::size_t i) { return (i * 977) % kMaxSize; };
  std::atomic<std::size_t> consumed{0};

  std::thread sender([&] {
    std::size_t sent = 0;
    std::size_t completed = 0;
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    while (completed < kMessages && Clock::now() < deadline) {
      // Never more in flight than the receiver has buffers for.
      if (sent < kMessages && sent - consumed.load() < kWindow / 2) {
        SendWorkRequest wr = MakeSend(sent, SendOpcode::kSend);
        AddSge(wr, src.addr(), static_cast<std::uint32_t>(size_of(sent)), skey);
        if (a_.qp->PostSend(wr) == PostStatus::kOk) ++sent;
      }
      completed += a_.send_cq->Poll(batch);
    }
  });

  std::size_t received = 0;
  std::size_t mismatches = 0;
  std::array<WorkCompletion, 16> batch;
  const auto deadline = Clock::now() + kWait;
  while (received < kMessages && Clock::now() < deadline) {
    const std::size_t got = b_.recv_cq->PollWithProgress(batch);
    for (std::size_t i = 0; i < got; ++i) {
      const WorkCompletion& wc = batch[i];
      const std::size_t size = size_of(received);
      const std::uint8_t* at = rbufs.data() + (received % kWindow) * kMaxSize;
      if (wc.wr_id != received || wc.status != WcStatus::kSuccess || wc.byte_len != size ||
          !SameBytes(at, src.data(), size)) {
        ++mismatches;
      }
      ++received;
      if (wc.wr_id + kWindow < kMessages) post_slot(wc.wr_id + kWindow);
      consumed.store(received);
    }
  }
  sender.join();
  EXPECT_EQ(received, kMessages);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_TRUE(StaysEmpty(*b_.recv_cq, std::chrono::milliseconds(50)));
  EXPECT_EQ(b_.qp->Counters().rx_fpdus, a_.qp->Counters().tx_fpdus);
}

TEST_F(PollProgressTest, DestroyWhileAnotherThreadPollsWithProgress) {
  Link(a_, b_, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t id = 0; id < 32; ++id) PostRecv(b_, id, rbuf, key);
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> polled{0};
  std::thread poller([&] {
    std::array<WorkCompletion, 16> batch;
    while (!stop.load()) polled += b_.recv_cq->PollWithProgress(batch);
  });
  for (std::uint64_t id = 0; id < 16; ++id) {
    ASSERT_EQ(a_.qp->PostSend(MakeSend(id, SendOpcode::kSend)), PostStatus::kOk);
  }
  EXPECT_TRUE(WaitUntil([&] { return polled.load() == 16; }));
  b_.qp->Destroy();
  b_.qp.reset();
  // The QP is gone from its CQs: polling goes on, with nothing to drive.
  EXPECT_TRUE(WaitUntil([&] { return polled.load() == 16; }));
  stop = true;
  poller.join();
  EXPECT_EQ(polled.load(), 16u);
}

TEST_F(PollProgressTest, PeerCloseWhileThePollerDrivesFlushesTheReceivesOnce) {
  Link(a_, b_, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t id = 0; id < 8; ++id) PostRecv(b_, id, rbuf, key);
  for (std::uint64_t id = 0; id < 3; ++id) {
    ASSERT_EQ(a_.qp->PostSend(MakeSend(id, SendOpcode::kSend)), PostStatus::kOk);
  }
  ASSERT_TRUE(a_.qp->Disconnect());
  const auto wc = PollProgressFor(*b_.recv_cq, 8);
  ASSERT_EQ(wc.size(), 8u);
  for (std::size_t i = 0; i < wc.size(); ++i) {
    EXPECT_EQ(wc[i].wr_id, i);
    EXPECT_EQ(wc[i].status, i < 3 ? WcStatus::kSuccess : WcStatus::kWrFlushErr) << i;
  }
  EXPECT_TRUE(WaitUntil([&] { return b_.qp->state() == QpState::kError; }));
  EXPECT_TRUE(StaysEmpty(*b_.recv_cq, std::chrono::milliseconds(50)));
}

// The poller drives b's receive side and so holds its read lease; then it
// stops polling without arming anything. The next message must still
// complete, through the progress thread once the lease ran out (the passive
// side of a benchmark polls nothing).
TEST_F(PollProgressTest, MessageCompletesAfterThePollerStopsPolling) {
  ASSERT_NO_FATAL_FAILURE(LinkWithBLeased());
  // Empty polls that drive: the lease is taken and extended.
  std::array<WorkCompletion, 4> batch;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);

  // An RDMA Write (no completion at b) and a Send; b's thread only looks.
  Buffer target(256);
  const std::uint32_t rkey = target.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer src(256);
  src.Fill(4);
  SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
  AddSge(write, src.addr(), 256, src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite));
  write.rkey = rkey;
  write.remote_addr = target.addr();
  ASSERT_EQ(a_.qp->PostSend(write), PostStatus::kOk);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(2, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*b_.recv_cq, 1);  // Poll only: no driving
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(SameBytes(target.data(), src.data(), 256));
}

// Arming the CQ while the poller holds the read lease (it ends there and
// then): the next message is notified and completes with nobody polling.
TEST_F(PollProgressTest, ArmingTheCqWhileLeasedLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(LinkWithBLeased());
  std::array<WorkCompletion, 4> batch;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  b_.recv_cq->Arm(CqArm::kNextCompletion);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  EXPECT_TRUE(WaitUntil([&] { return b_.recv_notifications.load() == 1; }));
  const auto wc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
}

// A poller that keeps taking the read lease, pausing (the lease runs out on
// the progress thread) and arming the CQ (it ends on this thread), while
// the peer streams Sends and Writes: every message completes once, in
// order, with its data, whoever read it.
TEST_F(PollProgressTest, LeaseTakenExpiredAndReturnedWhileThePeerStreams) {
  Link(a_, b_, Transport::kTcp, {});
  constexpr std::size_t kMessages = 1500;
  constexpr std::size_t kMaxSize = 5000;
  constexpr std::size_t kWindow = 64;
  Buffer rbufs(kWindow * kMaxSize);
  const std::uint32_t rkey = rbufs.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  auto post_slot = [&](std::uint64_t id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, rbufs.addr() + (id % kWindow) * kMaxSize, kMaxSize, rkey);
    return b_.qp->PostRecv(rwr) == PostStatus::kOk;
  };
  for (std::uint64_t id = 0; id < kWindow; ++id) ASSERT_TRUE(post_slot(id));
  Buffer target(kMaxSize);
  const std::uint32_t target_key = target.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer src(kMaxSize);
  src.Fill(8);
  const std::uint32_t skey = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  auto size_of = [](std::size_t i) { return (i * 613) % kMaxSize; };
  std::atomic<std::size_t> consumed{0};
  std::atomic<bool> failed{false};

  std::thread sender([&] {
    std::size_t sent = 0;
    std::size_t completed = 0;
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    while (completed < 2 * kMessages && Clock::now() < deadline) {
      if (sent < kMessages && sent - consumed.load() < kWindow / 2) {
        // A Write into b's target (no completion at b), then the Send.
        SendWorkRequest write = MakeSend(2 * sent, SendOpcode::kRdmaWrite);
        AddSge(write, src.addr(), static_cast<std::uint32_t>(size_of(sent)), skey);
        write.rkey = target_key;
        write.remote_addr = target.addr();
        SendWorkRequest send = MakeSend(2 * sent + 1, SendOpcode::kSend);
        AddSge(send, src.addr(), static_cast<std::uint32_t>(size_of(sent)), skey);
        if (a_.qp->PostSend(write) != PostStatus::kOk || a_.qp->PostSend(send) != PostStatus::kOk) {
          failed = true;
          return;
        }
        ++sent;
      }
      completed += a_.send_cq->PollWithProgress(batch);
    }
    if (completed != 2 * kMessages) failed = true;
  });

  std::size_t received = 0;
  std::size_t mismatches = 0;
  std::array<WorkCompletion, 16> batch;
  const auto deadline = Clock::now() + kWait;
  for (std::size_t turn = 0; received < kMessages && Clock::now() < deadline; ++turn) {
    // A burst of driving polls, then a pause or an arm, in turns.
    std::size_t got = 0;
    for (int i = 0; i < 200 && got == 0; ++i) got = b_.recv_cq->PollWithProgress(batch);
    if (turn % 7 == 3) b_.recv_cq->Arm(CqArm::kNextCompletion);
    if (turn % 11 == 5) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    if (got == 0) got = b_.recv_cq->Poll(batch);
    for (std::size_t i = 0; i < got; ++i) {
      const WorkCompletion& wc = batch[i];
      const std::size_t size = size_of(received);
      const std::uint8_t* at = rbufs.data() + (received % kWindow) * kMaxSize;
      if (wc.wr_id != received || wc.status != WcStatus::kSuccess || wc.byte_len != size ||
          !SameBytes(at, src.data(), size)) {
        ++mismatches;
      }
      ++received;
      if (wc.wr_id + kWindow < kMessages && !post_slot(wc.wr_id + kWindow)) ++mismatches;
      consumed.store(received);
    }
  }
  sender.join();
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(received, kMessages);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_TRUE(StaysEmpty(*b_.recv_cq, std::chrono::milliseconds(20)));
  EXPECT_EQ(b_.qp->Counters().rx_fpdus, a_.qp->Counters().tx_fpdus);
}

// More QPs on one CQ than an empty poll drives
// (CompletionQueue::kDriversPerEmptyPoll): with the progress thread held,
// polls alone still complete a message on every one of them (round-robin).
TEST_F(PollProgressTest, EveryQpOfManyOnOneCqProgressesThroughPollsAlone) {
  Link(a_, b_, Transport::kTcp, {});
  constexpr std::size_t kExtra = 3 * CompletionQueue::kDriversPerEmptyPoll + 1;
  std::vector<std::unique_ptr<ExtraQpOnTheCqs>> extras;
  std::vector<std::shared_ptr<Qp>> qps{b_.qp};
  std::vector<Qp*> senders{a_.qp.get()};
  for (std::size_t i = 0; i < kExtra; ++i) {
    extras.push_back(std::make_unique<ExtraQpOnTheCqs>(b_, a_.engine));
    ASSERT_NE(extras.back()->qp, nullptr);
    qps.push_back(extras.back()->qp);
    senders.push_back(extras.back()->peer.qp.get());
  }
  auto post_round = [&](std::uint64_t base) {
    for (std::size_t i = 0; i < qps.size(); ++i) {
      ReceiveWorkRequest rwr;
      rwr.wr_id = base + i;
      ASSERT_EQ(qps[i]->PostRecv(rwr), PostStatus::kOk);
      ASSERT_EQ(senders[i]->PostSend(MakeSend(i, SendOpcode::kSend, 0)), PostStatus::kOk);
    }
  };
  // A first round through the progress thread: every QP is running.
  post_round(0);
  ASSERT_EQ(WaitCompletions(*b_.recv_cq, qps.size()).size(), qps.size());

  ProgressThreadBlocker blocker(b_, a_.engine);
  ASSERT_TRUE(blocker.Block());
  post_round(1000);
  const auto wc = PollProgressFor(*b_.recv_cq, qps.size());
  EXPECT_TRUE(blocker.blocked());
  ASSERT_EQ(wc.size(), qps.size());
  std::vector<bool> seen(qps.size(), false);
  for (const WorkCompletion& c : wc) {
    EXPECT_EQ(c.status, WcStatus::kSuccess);
    ASSERT_GE(c.wr_id, 1000u);
    ASSERT_LT(c.wr_id - 1000, qps.size());
    EXPECT_FALSE(seen[c.wr_id - 1000]);
    seen[c.wr_id - 1000] = true;
  }
  blocker.Release();
}

// An application that polls without a pause keeps its read lease, and the
// progress thread looks at it only at first (read_lease.h): it used to wake
// every millisecond for as long as the polling lasted, later every 8 ms,
// and on a machine without a spare core each wake-up preempted a spinning
// application (the 99th percentile of ib_send_lat, performance-notes 3.9,
// 3.32). Within one lease, looks come 1, 3 and 7 ms after it starts; then
// the polls keep pushing the engine's lease watch out. A poller preempted
// for more than 1 ms lets its lease lapse, and the next lease starts its
// looks over, so the bound counts the leases taken, nothing assumed: one
// look per lease at the watch's lapse, three before it, one for a timer
// left from the lease before, and one under way as we read.
TEST_F(PollProgressTest, AHeldLeaseWakesTheProgressThreadOnlyAtFirst) {
  Link(a_, b_, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t id = 0; id < 4; ++id) PostRecv(b_, id, rbuf, key);
  const auto start = Clock::now();
  ASSERT_EQ(a_.qp->PostSend(MakeSend(0, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*b_.recv_cq, 1).size(), 1u);  // b holds the lease now
  // Empty driving polls (for less than Qp::kQuietBeforePollWait, so the
  // stream is not left to the progress thread as quiet): until the lease is
  // past its first looks (a loaded machine may delay them), then 60 ms.
  std::array<WorkCompletion, 4> batch;
  const auto poll_for = [&](Clock::duration length) {
    const auto until = Clock::now() + length;
    while (Clock::now() < until) ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  };
  while (!b_.qp->read_lease_watched() && Clock::now() - start < kWait) {
    poll_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(b_.qp->read_lease_watched());
  const std::uint64_t looks_before = b_.qp->read_lease_looks();
  const std::uint64_t leases_before = b_.qp->read_leases_taken();
  const std::uint64_t watch_turns_before = b_.engine->lease_watch_turns();
  poll_for(std::chrono::milliseconds(60));
  const std::uint64_t looks = b_.qp->read_lease_looks() - looks_before;
  const std::uint64_t leases = b_.qp->read_leases_taken() - leases_before;
  // Looking every kMaxReadLeaseCheck, as before the watch, would be 7 or 8.
  EXPECT_LE(looks, 5 * leases + 1) << "over 60 ms of polling, " << leases << " new lease(s)";
  RecordProperty("looks", static_cast<int>(looks));
  // The lease still ends once the polls stop: the watch's alarm goes off,
  // and the next Send completes through the progress thread.
  ASSERT_EQ(a_.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_GT(b_.engine->lease_watch_turns(), watch_turns_before);
}

// Many QPs on one CQ, all leased by one polling thread, each lease taken at
// a time of its own: once every lease is past its first looks, the progress
// thread does not wake for any of them while the thread polls on (one
// watch for all, read_lease.h). Each lease's looks used to keep the phase
// it started with: eight QPs woke the thread 78 times in 90 ms; on a common
// grid of kMaxReadLeaseCheck, once per tick. The bound counts, per lease
// taken in the window (a preempted poller's lapse), its three first looks,
// a timer left from the lease before and the watch's turn that ended it,
// plus one turn under way as we read.
TEST_F(PollProgressTest, LeasesOfManyQpsWakeTheProgressThreadOnlyAtFirst) {
  Link(a_, b_, Transport::kTcp, {});
  constexpr std::size_t kQps = 2 * CompletionQueue::kDriversPerEmptyPoll;
  std::vector<std::unique_ptr<ExtraQpOnTheCqs>> extras;
  std::vector<std::shared_ptr<Qp>> qps{b_.qp};
  for (std::size_t i = 1; i < kQps; ++i) {
    extras.push_back(std::make_unique<ExtraQpOnTheCqs>(b_, a_.engine));
    ASSERT_NE(extras.back()->qp, nullptr);
    qps.push_back(extras.back()->qp);
  }
  Buffer rbuf(64);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  const auto leases_taken = [&] {
    std::uint64_t leases = 0;
    for (const auto& qp : qps) leases += qp->read_leases_taken();
    return leases;
  };
  const auto turns_taken = [&] {
    return b_.engine->timer_turns() + b_.engine->lease_watch_turns();
  };
  const std::uint64_t leases_at_start = leases_taken();
  // A driving poll takes the lease of a QP with a receive posted: the
  // receives go to one QP every 1.1 ms, so each lease starts at a time of
  // its own.
  std::array<WorkCompletion, 4> batch;
  const auto poll_for = [&](Clock::duration length) {
    const auto until = Clock::now() + length;
    while (Clock::now() < until) ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  };
  for (std::size_t i = 0; i < kQps; ++i) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = i;
    AddSge(rwr, rbuf.addr(), 64, key);
    ASSERT_EQ(qps[i]->PostRecv(rwr), PostStatus::kOk);
    poll_for(std::chrono::microseconds(1100));
  }
  // Until every lease is past its first looks (a loaded machine may delay
  // them).
  const auto all_watched = [&] {
    return std::all_of(qps.begin(), qps.end(),
                       [](const std::shared_ptr<Qp>& qp) { return qp->read_lease_watched(); });
  };
  const auto wait_start = Clock::now();
  while (!all_watched() && Clock::now() - wait_start < kWait) {
    poll_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(all_watched());
  ASSERT_GE(leases_taken() - leases_at_start, kQps);
  const std::uint64_t leases_before = leases_taken();
  const std::uint64_t turns_before = turns_taken();
  poll_for(std::chrono::milliseconds(80));
  const std::uint64_t turns = turns_taken() - turns_before;
  const std::uint64_t leases = leases_taken() - leases_before;
  // On the grid of kMaxReadLeaseCheck, 10 or 11.
  EXPECT_LE(turns, 5 * leases + 1) << "over 80 ms of polling " << kQps << " QPs, " << leases
                                   << " new lease(s)";
  RecordProperty("turns", static_cast<int>(turns));
  RecordProperty("leases", static_cast<int>(leases));
}

// A lease takes read interest off the socket's poller entry without taking
// the entry out (epoll_ctl MOD to an empty mask): a DEL and an ADD per lease,
// and per answer spin (two a message in a ping-pong), made the kernel free
// epoll items through RCU and wake its threads on the CPUs of spinning
// applications (docs/performance-notes.md 3.27). Once the lease has run out,
// read interest is back on the same entry.
TEST_F(PollProgressTest, ALeaseTakesReadInterestOffWithoutLeavingThePoller) {
  ASSERT_NO_FATAL_FAILURE(LinkWithBLeased());
  const int epoll_fd = b_.engine->poller_fd();
  const void* entry = b_.qp.get();
  // A lease lapses when this thread is held off for a millisecond: only
  // looks that found read interest off are judged, and none may find the
  // entry gone.
  std::array<WorkCompletion, 4> batch;
  std::size_t judged = 0;
  std::uint64_t next = 1;  // receives 1 to 3 are still posted
  const auto deadline = Clock::now() + kWait;
  while (judged < 20 && Clock::now() < deadline) {
    ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);  // extends the lease
    const std::optional<std::uint32_t> mask = PollerMaskOf(epoll_fd, entry);
    ASSERT_TRUE(mask.has_value()) << "the socket left the poller during the lease";
    if ((*mask & EPOLLIN) == 0) {
      ++judged;
    } else if (next < 3) {
      // It lapsed; a quiet stream would stay with the progress thread, so
      // a message that a driving poll completes takes the lease again.
      ASSERT_EQ(a_.qp->PostSend(MakeSend(next++, SendOpcode::kSend)), PostStatus::kOk);
      ASSERT_EQ(PollProgressFor(*b_.recv_cq, 1).size(), 1u);
    }
  }
  EXPECT_GT(judged, 0u);
  // The polls stopped: the lease runs out, and the next Send completes
  // through the progress thread, read interest back on.
  ASSERT_EQ(a_.qp->PostSend(MakeSend(next, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, next);
  const std::optional<std::uint32_t> mask = PollerMaskOf(epoll_fd, entry);
  ASSERT_TRUE(mask.has_value());
  EXPECT_NE(*mask & EPOLLIN, 0u);
}

// A poll's receive turn that found the socket empty keeps the QP's polls
// from reading for Qp::kEmptyPollBackoff: a poll that ended before that
// deadline took no receive turn (no recvmsg). Only polls the clock shows
// ended inside the backoff are judged, so a slow machine cannot fail it.
TEST_F(PollProgressTest, EmptyPollRightAfterAnEmptyReadMakesNoSystemCall) {
  // Thousands of empty polls: a yield between the two would push the second
  // past the backoff, and no poll would be judged.
  CompletionQueue::SetEmptyPollsBeforeYield(0);
  struct Restore {
    ~Restore() {
      CompletionQueue::SetEmptyPollsBeforeYield(CompletionQueue::kDefaultEmptyPollsBeforeYield);
    }
  } restore;
  ASSERT_NO_FATAL_FAILURE(LinkWithBLeased());

  std::array<WorkCompletion, 4> batch;
  std::size_t judged = 0;
  std::size_t turns_in_backoff = 0;
  for (int i = 0; i < 2000 && judged < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // backoff over
    const std::uint64_t before = b_.qp->poll_receive_turns();
    ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
    const std::uint64_t after_first = b_.qp->poll_receive_turns();
    const auto idle_until = b_.qp->poll_idle_until();
    ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
    const std::uint64_t after_second = b_.qp->poll_receive_turns();
    const auto end = std::chrono::steady_clock::now().time_since_epoch().count();
    if (after_first == before || end >= idle_until) continue;
    ++judged;
    if (after_second != after_first) ++turns_in_backoff;
  }
  if (judged == 0) GTEST_SKIP() << "no poll ended inside the backoff on this machine";
  EXPECT_EQ(turns_in_backoff, 0u) << "of " << judged << " polls inside the backoff";
}

// ---- The bounded wait of an empty poll (CompletionQueue::set_poll_wait,
// Qp::PollMayWait; SIWX_POLL_WAIT_US) ----

// The sender's socket fills (the receiver's progress thread is held), so
// its transmit side waits for EPOLLOUT: polls of its send CQ sleep instead
// of spinning. Once the receiver reads again every Write completes, in
// order, and its data arrived.
TEST_F(PollProgressTest, SenderBlockedOnAFullSocketWaitsInPollAndEveryWriteCompletes) {
  Link(a_, b_, Transport::kTcp, {});
  ProgressThreadBlocker blocker(b_, a_.engine);
  ASSERT_TRUE(blocker.Block());
  a_.send_cq->set_poll_wait(std::chrono::milliseconds(1));

  constexpr std::size_t kSize = 64 * 1024;
  constexpr std::uint64_t kWrites = 200;  // 12.5 MiB: more than both socket buffers
  Buffer target(kSize);
  const std::uint32_t rkey = target.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer src(kSize);
  src.Fill(9);
  const std::uint32_t lkey = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t id = 0; id < kWrites; ++id) {
    SendWorkRequest write = MakeSend(id, SendOpcode::kRdmaWrite);
    AddSge(write, src.addr(), kSize, lkey);
    write.rkey = rkey;
    write.remote_addr = target.addr();
    ASSERT_EQ(a_.qp->PostSend(write), PostStatus::kOk);
  }
  std::vector<WorkCompletion> done;
  std::array<WorkCompletion, 16> batch;
  const auto deadline = Clock::now() + kWait;
  while (a_.send_cq->poll_waits() == 0 && Clock::now() < deadline) {
    const std::size_t got = a_.send_cq->PollWithProgress(batch);
    done.insert(done.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(got));
  }
  EXPECT_GT(a_.send_cq->poll_waits(), 0u);
  EXPECT_LT(done.size(), kWrites);  // the socket was full
  EXPECT_TRUE(blocker.blocked());

  blocker.Release();
  const auto rest = PollProgressFor(*a_.send_cq, kWrites - done.size());
  done.insert(done.end(), rest.begin(), rest.end());
  ASSERT_EQ(done.size(), kWrites);
  for (std::uint64_t i = 0; i < kWrites; ++i) {
    EXPECT_EQ(done[i].wr_id, i);
    EXPECT_EQ(done[i].status, WcStatus::kSuccess);
  }
  // The last Write is placed once b reads it; a Send after it tells when.
  Buffer rbuf(8);
  PostRecv(b_, 1, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  ASSERT_EQ(a_.qp->PostSend(MakeSend(kWrites, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b_.recv_cq, 1).size(), 1u);
  EXPECT_TRUE(SameBytes(target.data(), src.data(), kSize));
}

// A receiver polling a stream that has been quiet for
// Qp::kQuietBeforePollWait sleeps in its poll (the read lease ends); a Send
// that arrives then is read by the progress thread, whose push ends the
// wait, and that same poll returns it.
TEST_F(PollProgressTest, PollOnAQuietStreamSleepsUntilTheProgressThreadPushes) {
  Link(a_, b_, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  PostRecv(b_, 0, rbuf, key);
  PostRecv(b_, 1, rbuf, key);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(0, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*b_.recv_cq, 1).size(), 1u);  // b holds the lease now
  // Far longer than the test may run: a lost wake-up shows as a timeout.
  b_.recv_cq->set_poll_wait(std::chrono::minutes(10));
  std::vector<WorkCompletion> got;
  std::thread poller([&] {
    std::array<WorkCompletion, 4> batch;
    std::size_t n = 0;
    while (n == 0) n = b_.recv_cq->PollWithProgress(batch);
    got.assign(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
  });
  ASSERT_TRUE(WaitUntil([&] { return b_.recv_cq->poll_waits() > 0; }));
  Buffer src(40);
  src.Fill(6);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kSend);
  AddSge(wr, src.addr(), 40, src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite));
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  poller.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].byte_len, 40u);
  EXPECT_TRUE(SameBytes(rbuf.data(), src.data(), 40));
  EXPECT_EQ(b_.recv_cq->poll_wait_timeouts(), 0u);
}

// Streams `messages` Sends of kSinkSize from a to b: a posts only into
// receives b has posted, b polls its receive CQ with progress, checks every
// completion (once, in order, with its data) and posts the next receive.
// Returns how many b received; b has kSinkWindow receives posted after it.
class SinkStream {
 public:
  static constexpr std::size_t kSize = 32 * 1024;
  static constexpr std::uint64_t kWindow = 64;

  SinkStream(Node& a, Node& b)
      : a_(a), b_(b), rbufs_(kWindow * kSize), src_(kWindow * kSize) {
    rkey_ = rbufs_.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
    for (std::uint64_t i = 0; i < kWindow; ++i) {
      for (std::size_t j = 0; j < kSize; ++j) {
        src_.data()[i * kSize + j] = PatternByte(static_cast<std::uint32_t>(i), j);
      }
    }
    lkey_ = src_.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
    for (std::uint64_t id = 0; id < kWindow; ++id) EXPECT_TRUE(PostSlot(id));
  }

  bool PostSlot(std::uint64_t id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, rbufs_.addr() + (id % kWindow) * kSize, kSize, rkey_);
    return b_.qp->PostRecv(rwr) == PostStatus::kOk;
  }

  // `pause`: the receiver stops polling for that long after every
  // kPauseEvery messages (its read lease lapses meanwhile).
  static constexpr std::uint64_t kPauseEvery = 48;
  std::uint64_t Run(std::uint64_t messages,
                    std::chrono::microseconds pause = std::chrono::microseconds(0)) {
    const std::uint64_t first = sent_;
    const std::uint64_t last = first + messages;
    std::thread sender([&] {
      std::array<WorkCompletion, 16> batch;
      const auto deadline = Clock::now() + kWait;
      while (sent_ < last && Clock::now() < deadline) {
        // Only into receives b has posted (a Send without one ends the stream).
        while (sent_ < last && sent_ < posted_upto_.load()) {
          SendWorkRequest wr = MakeSend(sent_, SendOpcode::kSend);
          AddSge(wr, src_.addr() + (sent_ % kWindow) * kSize, kSize, lkey_);
          if (a_.qp->PostSend(wr) != PostStatus::kOk) return;
          ++sent_;
        }
        a_.send_cq->PollWithProgress(batch);
      }
    });
    std::array<WorkCompletion, 16> batch;
    const auto deadline = Clock::now() + kWait;
    bool good = true;
    while (good && received_ < last && Clock::now() < deadline) {
      const std::size_t n = b_.recv_cq->PollWithProgress(batch);
      for (std::size_t i = 0; i < n && good; ++i) {
        const WorkCompletion& wc = batch[i];
        const std::size_t slot = (received_ % kWindow) * kSize;
        EXPECT_EQ(wc.wr_id, received_);
        EXPECT_EQ(wc.status, WcStatus::kSuccess);
        EXPECT_EQ(wc.byte_len, kSize);
        EXPECT_TRUE(SameBytes(rbufs_.data() + slot, src_.data() + slot, kSize));
        good = wc.wr_id == received_ && wc.status == WcStatus::kSuccess &&
               PostSlot(received_ + kWindow);
        posted_upto_.store(received_ + kWindow + 1);
        ++received_;
        if (pause.count() > 0 && received_ % kPauseEvery == 0) std::this_thread::sleep_for(pause);
      }
    }
    sender.join();
    return received_ - first;
  }

 private:
  Node& a_;
  Node& b_;
  Buffer rbufs_;
  Buffer src_;
  std::uint32_t rkey_ = 0;
  std::uint32_t lkey_ = 0;
  std::uint64_t sent_ = 0;      // sender thread while Run lasts
  std::uint64_t received_ = 0;
  std::atomic<std::uint64_t> posted_upto_{kWindow};  // receives b has posted
};

// A pure sink (Qp::kSinkOctets in since its last PostSend) whose receive CQ
// has other drivers leaves reading to the progress thread and its polls may
// sleep on the CQ: every Send of a stream still completes once, in order,
// with its data, and after the stream an empty poll of the sink sleeps
// (bounded) on the CQ, not on the socket.
TEST_F(PollProgressTest, SinkSharingItsCqLeavesReadingToTheProgressThreadAndLosesNothing) {
  Link(a_, b_, Transport::kTcp, {});
  ExtraQpOnTheCqs second(b_, a_.engine);
  b_.recv_cq->set_poll_wait(std::chrono::microseconds(200));
  SinkStream stream(a_, b_);
  constexpr std::uint64_t kMessages = 2 * (Qp::kSinkOctets / SinkStream::kSize);
  ASSERT_EQ(stream.Run(kMessages), kMessages);
  ASSERT_FALSE(b_.recv_cq->single_driver());
  std::array<WorkCompletion, 16> batch;
  const std::uint64_t waits = b_.recv_cq->poll_waits();
  ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  EXPECT_EQ(b_.recv_cq->poll_waits(), waits + 1);
  EXPECT_EQ(b_.recv_cq->input_waits(), 0u);
}

// A sink alone on its receive CQ reads its own stream (run to completion)
// and, when the socket is empty, sleeps on the socket instead of on the CQ
// (PollDriver::WaitForInput; docs/performance-notes.md 3.16). Once the
// stream is a sink, b's progress thread is held, so only b's polls can
// read: a sink left to that thread would stall the stream. Every Send
// completes once, in order, with its data, and after the stream an empty
// poll sleeps on the socket.
TEST_F(PollProgressTest, SinkAloneOnItsCqReadsItsOwnStreamAndSleepsOnItsSocket) {
  Link(a_, b_, Transport::kTcp, {});
  b_.recv_cq->set_poll_wait(std::chrono::microseconds(200));
  SinkStream stream(a_, b_);
  // Not held before the stream is a sink: a stream that is no sink yet and
  // quiet for Qp::kQuietBeforePollWait (a starved sender on a loaded
  // machine) is the progress thread's to read, as it must be.
  constexpr std::uint64_t kToSink = Qp::kSinkOctets / SinkStream::kSize;
  ASSERT_EQ(stream.Run(kToSink), kToSink);
  ASSERT_TRUE(b_.qp->IsSink());
  ProgressThreadBlocker blocker(b_, a_.engine);
  ASSERT_TRUE(blocker.Block());
  constexpr std::uint64_t kMessages = 2 * (Qp::kSinkOctets / SinkStream::kSize);
  const std::uint64_t turns = b_.qp->poll_receive_turns();
  ASSERT_EQ(stream.Run(kMessages), kMessages);
  ASSERT_TRUE(b_.recv_cq->single_driver());
  EXPECT_GT(b_.qp->poll_receive_turns(), turns);
  std::array<WorkCompletion, 16> batch;
  ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);  // polls this CQ only from now on
  const std::uint64_t waits = b_.recv_cq->poll_waits();
  const std::uint64_t input_waits = b_.recv_cq->input_waits();
  ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  EXPECT_EQ(b_.recv_cq->input_waits(), input_waits + 1);
  EXPECT_EQ(b_.recv_cq->poll_waits(), waits);
  // A message that arrives after such a sleep is still read and completes.
  ASSERT_EQ(stream.Run(4), 4u);
  EXPECT_TRUE(blocker.blocked());
}

// The receive side of one sink QP changes hands while the stream runs: its
// poller reads (read lease held, sleeping on the socket when it is empty),
// stops polling for a few lease lengths (the lease lapses: the progress
// thread reads and pushes), and takes the stream back. Every Send completes
// once, in order, with its data (the race that TSan checks).
TEST_F(PollProgressTest, SinkPollerAndProgressThreadHandTheStreamBackAndForth) {
  Link(a_, b_, Transport::kTcp, {});
  b_.recv_cq->set_poll_wait(std::chrono::microseconds(200));
  SinkStream stream(a_, b_);
  constexpr std::uint64_t kMessages = 3 * (Qp::kSinkOctets / SinkStream::kSize);
  ASSERT_EQ(stream.Run(kMessages, std::chrono::microseconds(3000)), kMessages);
}

// A sink that posts now and then, sometimes two posts close together (the
// receiver of perftest's ib_send_bw sends a credit every 170 messages, and
// two of them 2 messages apart once every 512) stays a sink after such a
// pair: its empty polls sleep and take no receive turn, where with "since
// the last post" alone it read the stream itself, spinning, for the next
// Qp::kSinkOctets (docs/performance-notes.md 3.10).
TEST_F(PollProgressTest, SinkStaysASinkAfterTwoPostsCloseTogether) {
  Link(a_, b_, Transport::kTcp, {});
  b_.recv_cq->set_poll_wait(std::chrono::microseconds(200));
  SinkStream stream(a_, b_);
  Buffer credit(4);
  const std::uint32_t credit_key = credit.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  Buffer credit_in(8);
  const std::uint32_t credit_in_key =
      credit_in.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  auto send_credit = [&](std::uint64_t id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, credit_in.addr(), 8, credit_in_key);
    ASSERT_EQ(a_.qp->PostRecv(rwr), PostStatus::kOk);
    SendWorkRequest wr = MakeSend(id, SendOpcode::kSend);
    AddSge(wr, credit.addr(), 4, credit_key);
    ASSERT_EQ(b_.qp->PostSend(wr), PostStatus::kOk);
  };
  // Well over 2 x kSinkOctets between posts, then a pair.
  constexpr std::uint64_t kBetween = 3 * (Qp::kSinkOctets / SinkStream::kSize);
  ASSERT_EQ(stream.Run(kBetween), kBetween);
  send_credit(1);
  ASSERT_EQ(stream.Run(kBetween), kBetween);
  send_credit(2);
  ASSERT_EQ(stream.Run(2), 2u);
  send_credit(3);
  // The credits complete (the transmit side then has nothing outstanding).
  ASSERT_EQ(PollProgressFor(*b_.send_cq, 3).size(), 3u);
  ASSERT_EQ(PollProgressFor(*a_.recv_cq, 3).size(), 3u);
  // A stretch of the stream well below kSinkOctets after the pair.
  ASSERT_EQ(stream.Run(8), 8u);
  std::array<WorkCompletion, 16> batch;
  ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);  // polls this CQ only from now on
  const std::uint64_t waits = b_.recv_cq->poll_waits();
  const std::uint64_t turns = b_.qp->poll_receive_turns();
  const std::uint64_t long_waits = b_.recv_cq->long_poll_waits();
  const std::uint64_t input_waits = b_.recv_cq->input_waits();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(b_.recv_cq->PollWithProgress(batch), 0u);
  // Alone on its receive CQ, a sink reads its own stream and sleeps on its
  // socket (performance-notes 3.16): each empty poll one such sleep, then
  // one receive turn; a QP that is no sink would spin (no sleep at all).
  EXPECT_EQ(b_.recv_cq->input_waits(), input_waits + 4);
  EXPECT_EQ(b_.recv_cq->poll_waits(), waits);
  EXPECT_GE(b_.qp->poll_receive_turns(), turns + 4);
  EXPECT_EQ(b_.recv_cq->long_poll_waits(), long_waits);
}

// ---- Back-to-back posts share one sendmsg (Qp::PostSendList,
// SIWX_TX_COALESCE_KIB; docs/performance-notes.md 3.13) ----

class TxCoalesceTest : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kPiece = 256;
  static constexpr std::size_t kPosts = 8;

  explicit TxCoalesceTest(std::size_t coalesce = kDefaultTxCoalesceOctets)
      : a_(OptionsWith(coalesce)), src_(kPiece * kPosts), dst_(kPiece * kPosts) {
    Link(a_, b_, Transport::kTcp, {});
    src_.Fill(11);
    lkey_ = src_.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
    rkey_ = dst_.Register(b_.memory(), b_.pd, kAllRemote);
    PostRecv(b_, 99, fence_in_, fence_in_.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  }
  static NodeOptions OptionsWith(std::size_t coalesce) {
    NodeOptions o;
    o.tx_coalesce_octets = coalesce;
    return o;
  }
  // Piece i of src_ to piece i of dst_, signaled.
  void PostWrite(std::size_t i) {
    SendWorkRequest wr = MakeSend(i, SendOpcode::kRdmaWrite);
    AddSge(wr, src_.addr() + i * kPiece, kPiece, lkey_);
    wr.rkey = rkey_;
    wr.remote_addr = dst_.addr() + i * kPiece;
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  }
  std::uint64_t Sendmsgs() const { return a_.qp->Counters().tx_syscalls; }
  // Posts an unsignaled Send behind the Writes (after a poll of a's CQ, so
  // it goes at once, unless `poll_first` is false) and waits until b
  // received it: the Writes before it are placed (RFC 5040 5.5 ordering).
  bool FenceArrived(bool poll_first = true) {
    if (poll_first) a_.send_cq->Poll({});
    SendWorkRequest wr = MakeSend(100, SendOpcode::kSend, 0);
    if (a_.qp->PostSend(wr) != PostStatus::kOk) return false;
    return WaitCompletions(*b_.recv_cq, 1).size() == 1;
  }
  bool AllPlaced() { return SameBytes(dst_.data(), src_.data(), kPiece * kPosts); }
  // Every post transmits at once: no post waits, one sendmsg each.
  void PostAllExpectingOneSendmsgEach() {
    const std::uint64_t before = Sendmsgs();
    for (std::size_t i = 0; i < kPosts; ++i) PostWrite(i);
    EXPECT_EQ(a_.qp->coalesced_posts(), 0u);
    EXPECT_EQ(Sendmsgs(), before + kPosts);
    ASSERT_TRUE(FenceArrived());
    EXPECT_TRUE(AllPlaced());
  }

  Node a_;
  Node b_;
  Buffer src_;
  Buffer dst_;
  Buffer fence_in_{8};
  std::uint32_t lkey_ = 0;
  std::uint32_t rkey_ = 0;
};

class TxCoalesceOffTest : public TxCoalesceTest {
 protected:
  TxCoalesceOffTest() : TxCoalesceTest(0) {}
};

// With a's progress thread held (so its timer cannot transmit), the first
// post goes out at once on the posting thread and the seven after it wait
// for the next poll of a's CQ, which sends them in one sendmsg.
TEST_F(TxCoalesceTest, PostsAfterTheFirstWaitForThePollAndShareOneSendmsg) {
  ProgressThreadBlocker blocker(a_, b_.engine);
  ASSERT_TRUE(blocker.Block());
  const std::uint64_t before = Sendmsgs();
  PostWrite(0);
  EXPECT_EQ(Sendmsgs(), before + 1);
  for (std::size_t i = 1; i < kPosts; ++i) PostWrite(i);
  EXPECT_EQ(a_.qp->coalesced_posts(), kPosts - 1);
  EXPECT_EQ(Sendmsgs(), before + 1);
  // A poll, even one that asks for nothing, transmits what waits.
  a_.send_cq->Poll({});
  EXPECT_TRUE(blocker.blocked());
  EXPECT_EQ(Sendmsgs(), before + 2);
  EXPECT_EQ(WaitCompletions(*a_.send_cq, kPosts).size(), kPosts);
  ASSERT_TRUE(FenceArrived());
  EXPECT_TRUE(AllPlaced());
}

// ibv_req_notify_cq: the application is about to sleep; nothing waits.
TEST_F(TxCoalesceTest, ArmingTheCqTransmitsWhatWaits) {
  ProgressThreadBlocker blocker(a_, b_.engine);
  ASSERT_TRUE(blocker.Block());
  const std::uint64_t before = Sendmsgs();
  for (std::size_t i = 0; i < kPosts; ++i) PostWrite(i);
  EXPECT_EQ(Sendmsgs(), before + 1);
  a_.send_cq->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(Sendmsgs(), before + 2);
  ASSERT_TRUE(FenceArrived());
  EXPECT_TRUE(AllPlaced());
}

// Armed before the posts (ibv_req_notify_cq on the receive CQ, posts,
// ibv_get_cq_event for the answer): the application sleeps on the channel
// and polls nothing, so no post waits. (An armed send CQ disarms at the
// first Write's completion, whose notification wakes the application.)
TEST_F(TxCoalesceTest, PostsOnAnArmedCqTransmitAtOnce) {
  ASSERT_NE(a_.recv_cq.get(), a_.send_cq.get());
  ProgressThreadBlocker blocker(a_, b_.engine);
  ASSERT_TRUE(blocker.Block());
  a_.recv_cq->Arm(CqArm::kNextCompletion);
  PostAllExpectingOneSendmsgEach();
}

// A poll between two posts: the second transmits at once too.
TEST_F(TxCoalesceTest, APostAfterAPollTransmitsAtOnce) {
  for (std::size_t i = 0; i < kPosts; ++i) {
    a_.send_cq->Poll({});
    PostWrite(i);
  }
  EXPECT_EQ(a_.qp->coalesced_posts(), 0u);
  EXPECT_EQ(WaitCompletions(*a_.send_cq, kPosts).size(), kPosts);
  ASSERT_TRUE(FenceArrived());
  EXPECT_TRUE(AllPlaced());
}

// An application that never polls a again: the progress thread's timer
// sends what waits (Qp::kTxCoalesceDelay).
TEST_F(TxCoalesceTest, WithoutAnotherPollTheProgressThreadTransmits) {
  for (std::size_t i = 0; i < kPosts; ++i) PostWrite(i);
  // The fence is back to back too: it waits with the Writes.
  ASSERT_TRUE(FenceArrived(/*poll_first=*/false));
  EXPECT_EQ(a_.qp->coalesced_posts(), kPosts);
  EXPECT_TRUE(AllPlaced());
  EXPECT_TRUE(WaitUntil([&] { return a_.send_cq->size() == kPosts; }));
}

// The octets that may wait are bounded: a post that would bring them to
// the limit transmits, with those before it.
TEST_F(TxCoalesceTest, APostReachingTheLimitTransmits) {
  constexpr std::size_t kLarge = kDefaultTxCoalesceOctets / 2 + 4096;
  Buffer big(3 * kLarge);
  big.Fill(5);
  Buffer sink(3 * kLarge);
  const std::uint32_t lkey = big.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  const std::uint32_t rkey = sink.Register(b_.memory(), b_.pd, kAllRemote);
  for (std::size_t i = 0; i < 3; ++i) {
    SendWorkRequest wr = MakeSend(i, SendOpcode::kRdmaWrite);
    AddSge(wr, big.addr() + i * kLarge, static_cast<std::uint32_t>(kLarge), lkey);
    wr.rkey = rkey;
    wr.remote_addr = sink.addr() + i * kLarge;
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  }
  // The first at once, the second waits, the third would bring the
  // waiting octets over the limit and sends both.
  EXPECT_EQ(a_.qp->coalesced_posts(), 1u);
  EXPECT_EQ(PollProgressFor(*a_.send_cq, 3).size(), 3u);
  ASSERT_TRUE(FenceArrived());
  EXPECT_TRUE(SameBytes(sink.data(), big.data(), 3 * kLarge));
}

// SIWX_TX_COALESCE_KIB=0: every post transmits at once, as before.
TEST_F(TxCoalesceOffTest, EveryPostTransmitsAtOnce) {
  ProgressThreadBlocker blocker(a_, b_.engine);
  ASSERT_TRUE(blocker.Block());
  PostAllExpectingOneSendmsgEach();
}

}  // namespace
}  // namespace siwx::engine::testing
