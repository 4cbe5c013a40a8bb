// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Completion and async events end to end through stock libibverbs:
// ibv_req_notify_cq -> provider -> completion channel -> ibv_get_cq_event ->
// ibv_ack_cq_events -> ibv_destroy_cq, and CQ overflow / SRQ limit ->
// async fd -> ibv_get_async_event.
//
// Until QPs exist nothing produces completions through the public API, so
// this test plays the engine's part: it reaches the engine queue behind an
// ibv_cq / ibv_srq (provider.h layout) and pushes completions or takes
// receives itself, on the application thread or on another thread, exactly
// where the progress thread will. Everything else is the public API. Runs
// under siwx-run (label verbs).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

class EventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ibv_device** list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    for (int i = 0; list[i] != nullptr; ++i) {
      if (std::string(ibv_get_device_name(list[i])) == "siwx_lo") ctx_ = ibv_open_device(list[i]);
    }
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr) << "no siwx_lo: run under siwx-run";
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }

  static engine::CompletionQueue& EngineQueue(ibv_cq* cq) { return *ToSiwx(cq)->queue; }

  static engine::WorkCompletion Completion(std::uint64_t wr_id) {
    engine::WorkCompletion wc;
    wc.wr_id = wr_id;
    wc.status = engine::WcStatus::kSuccess;
    wc.opcode = engine::WcOpcode::kRecv;
    wc.byte_len = 100;
    wc.qp_num = 7;
    return wc;
  }

  static bool Readable(int fd, int timeout_ms = 0) {
    pollfd pfd{fd, POLLIN, 0};
    return ::poll(&pfd, 1, timeout_ms) == 1;
  }

  ibv_context* ctx_ = nullptr;
};

TEST_F(EventsTest, ArmedCompletionIsDeliveredThroughTheChannel) {
  int cookie = 0;
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, &cookie, channel, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  EXPECT_FALSE(Readable(channel->fd));

  engine::WorkCompletion wc = Completion(0x1122334455667788ull);
  wc.wc_flags = engine::kWcWithImm;
  wc.imm_data = 0xA1B2C3D4;
  ASSERT_EQ(EngineQueue(cq).Push(wc), engine::PushStatus::kOk);
  ASSERT_TRUE(Readable(channel->fd));

  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq);
  EXPECT_EQ(ev_ctx, &cookie);
  ibv_ack_cq_events(cq, 1);

  ibv_wc out[2];
  ASSERT_EQ(ibv_poll_cq(cq, 2, out), 1);
  EXPECT_EQ(out[0].wr_id, 0x1122334455667788ull);
  EXPECT_EQ(out[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(out[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(out[0].byte_len, 100u);
  EXPECT_EQ(out[0].qp_num, 7u);
  EXPECT_EQ(out[0].wc_flags, static_cast<unsigned>(IBV_WC_WITH_IMM));
  EXPECT_EQ(out[0].imm_data, htobe32(0xA1B2C3D4));  // network order

  // One notification per arm: the next completion stays silent.
  ASSERT_EQ(EngineQueue(cq).Push(Completion(2)), engine::PushStatus::kOk);
  EXPECT_FALSE(Readable(channel->fd));
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(EventsTest, SolicitedOnlyArmIgnoresUnsolicitedSuccess) {
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 8, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq, 1), 0);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(1)), engine::PushStatus::kOk);
  EXPECT_FALSE(Readable(channel->fd));
  ASSERT_EQ(EngineQueue(cq).Push(Completion(2), /*solicited=*/true), engine::PushStatus::kOk);
  ASSERT_TRUE(Readable(channel->fd));
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq);
  ibv_ack_cq_events(cq, 1);
  // An error completion counts as solicited (ibv_req_notify_cq(3)).
  ASSERT_EQ(ibv_req_notify_cq(cq, 1), 0);
  engine::WorkCompletion failed = Completion(3);
  failed.status = engine::WcStatus::kWrFlushErr;
  ASSERT_EQ(EngineQueue(cq).Push(failed), engine::PushStatus::kOk);
  ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(cq, 1);

  ibv_wc out[4];
  ASSERT_EQ(ibv_poll_cq(cq, 4, out), 3);
  EXPECT_EQ(out[2].wr_id, 3u);
  EXPECT_EQ(out[2].status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(EventsTest, PollReturnsCompletionsInOrderInBatches) {
  ibv_cq* cq = ibv_create_cq(ctx_, 32, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  for (std::uint64_t i = 0; i < 20; ++i) {
    engine::WorkCompletion wc = Completion(i);
    if (i == 5) {
      wc.wc_flags = engine::kWcWithInv;
      wc.invalidated_rkey = 0x12345678;
    }
    ASSERT_EQ(EngineQueue(cq).Push(wc), engine::PushStatus::kOk);
  }
  ibv_wc out[7];
  std::uint64_t next = 0;
  for (int expected : {7, 7, 6, 0}) {
    ASSERT_EQ(ibv_poll_cq(cq, 7, out), expected);
    for (int i = 0; i < expected; ++i) {
      EXPECT_EQ(out[i].wr_id, next);
      if (next == 5) {
        EXPECT_EQ(out[i].wc_flags, static_cast<unsigned>(IBV_WC_WITH_INV));
        EXPECT_EQ(out[i].invalidated_rkey, 0x12345678u);  // host order
      }
      ++next;
    }
  }
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(EventsTest, OverflowRaisesCqErrOnTheAsyncFd) {
  ibv_cq* cq = ibv_create_cq(ctx_, 1, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(1)), engine::PushStatus::kOk);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(2)), engine::PushStatus::kOverflow);
  ASSERT_TRUE(Readable(ctx_->async_fd));
  ibv_async_event event;
  ASSERT_EQ(ibv_get_async_event(ctx_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(event.element.cq, cq);
  ibv_ack_async_event(&event);
  EXPECT_EQ(cq->async_events_completed, 1u);
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(EventsTest, DestroyTakesBackEventsNobodyRead) {
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 1, nullptr, channel, 0);
  ibv_cq* other = ibv_create_cq(ctx_, 4, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(ibv_req_notify_cq(other, 0), 0);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(1)), engine::PushStatus::kOk);
  ASSERT_EQ(EngineQueue(other).Push(Completion(2)), engine::PushStatus::kOk);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(3)), engine::PushStatus::kOverflow);  // CQ_ERR
  // Neither the completion event nor the CQ_ERR of `cq` was read: destroy
  // must not wait for acknowledgements of them, and must remove them.
  ASSERT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_FALSE(Readable(ctx_->async_fd));
  // The other CQ's event is still there, intact.
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, other);
  ibv_ack_cq_events(other, 1);
  EXPECT_FALSE(Readable(channel->fd));
  ASSERT_EQ(ibv_destroy_cq(other), 0);
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(EventsTest, DestroyWaitsUntilReadEventsAreAcknowledged) {
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(EngineQueue(cq).Push(Completion(1)), engine::PushStatus::kOk);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);  // read, not acked

  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(destroyed.load());  // ibv_get_cq_event(3): destroy waits for the ack
  ibv_ack_cq_events(ev_cq, 1);
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(EventsTest, ManyArmedCqsOnOneChannelLoseNoEvent) {
  // More events than the channel socket holds at once: the backlog keeps
  // them until ibv_get_cq_event makes room.
  constexpr int kCqs = 1500;
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < kCqs; ++i) {
    ibv_cq* cq = ibv_create_cq(ctx_, 1, nullptr, channel, 0);
    ASSERT_NE(cq, nullptr);
    ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
    cqs.push_back(cq);
  }
  // Fired from another thread, as the progress thread will.
  std::thread engine([&] {
    for (ibv_cq* cq : cqs) EngineQueue(cq).Push(Completion(1));
  });
  engine.join();
  EXPECT_GT(ToSiwx(channel)->events->backlog_size(), 0u);  // the socket alone did not suffice
  for (int i = 0; i < kCqs; ++i) {
    ASSERT_TRUE(Readable(channel->fd, 1000)) << "event " << i << " missing";
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
    ASSERT_EQ(ev_cq, cqs[static_cast<std::size_t>(i)]);  // in firing order
    ibv_ack_cq_events(ev_cq, 1);
  }
  EXPECT_FALSE(Readable(channel->fd));
  for (ibv_cq* cq : cqs) ASSERT_EQ(ibv_destroy_cq(cq), 0);
  ASSERT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(EventsTest, SrqLimitRaisesAnAsyncEventOnceAndDisarms) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_srq_init_attr init{};
  init.attr.max_wr = 4;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &init);
  ASSERT_NE(srq, nullptr);
  ibv_recv_wr wrs[4]{};
  for (int i = 0; i < 4; ++i) {
    wrs[i].wr_id = static_cast<std::uint64_t>(i);
    wrs[i].next = i < 3 ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq, wrs, &bad), 0);
  ibv_srq_attr attr{};
  attr.srq_limit = 2;
  ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);

  // The data path consumes receives: 3 left, 2 left (not below 2), 1 left.
  engine::ReceiveQueue& queue = *ToSiwx(srq)->queue;
  EXPECT_EQ(queue.Take()->wr_id, 0u);
  EXPECT_EQ(queue.Take()->wr_id, 1u);
  EXPECT_FALSE(Readable(ctx_->async_fd));
  EXPECT_EQ(queue.Take()->wr_id, 2u);
  ASSERT_TRUE(Readable(ctx_->async_fd));
  ibv_async_event event;
  ASSERT_EQ(ibv_get_async_event(ctx_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(event.element.srq, srq);
  ibv_ack_async_event(&event);
  EXPECT_EQ(srq->events_completed, 1u);
  // Disarmed (ibv_query_srq(3): limit 0 means not armed).
  ASSERT_EQ(ibv_query_srq(srq, &attr), 0);
  EXPECT_EQ(attr.srq_limit, 0u);
  EXPECT_EQ(queue.Take()->wr_id, 3u);
  EXPECT_FALSE(Readable(ctx_->async_fd));

  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  ASSERT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_F(EventsTest, SrqDestroyTakesBackAnUnreadLimitEvent) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_srq_init_attr init{};
  init.attr.max_wr = 2;
  ibv_srq* srq = ibv_create_srq(pd, &init);
  ASSERT_NE(srq, nullptr);
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  ibv_srq_attr attr{};
  attr.srq_limit = 1;
  ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
  ASSERT_TRUE(ToSiwx(srq)->queue->Take().has_value());  // 0 left < 1: event
  ASSERT_TRUE(Readable(ctx_->async_fd));
  ASSERT_EQ(ibv_destroy_srq(srq), 0);  // does not wait: the event was never read
  EXPECT_FALSE(Readable(ctx_->async_fd));
  ASSERT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace siwx::provider
