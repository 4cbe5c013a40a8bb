// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What siwx does inside the application's process besides moving data: an
// application thread that streams Writes or Sends and polls its CQs, as
// ib_write_bw and ib_send_bw do, allocates nothing per message once the
// stream runs; and the progress thread blocks the signals the application
// handles. Either slip lets an application's signal handler that allocates
// (perftest's SIGALRM handler of -D reads /proc through stdio) deadlock on
// the allocator lock the interrupted code holds; ib_write_bw -D hung so.
//
// This binary counts allocations per thread: through the sanitizer's
// allocator hooks where one owns the allocator, else by replacing operator
// new (the engine's containers and slots allocate through it).
#include <signal.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "engine/engine_test_util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SIWX_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SIWX_SANITIZER_ALLOCATOR 1
#endif
#endif

#ifdef SIWX_SANITIZER_ALLOCATOR
#include <sanitizer/allocator_interface.h>
#endif

namespace {

thread_local bool t_counting = false;
thread_local std::size_t t_allocations = 0;

#ifdef SIWX_SANITIZER_ALLOCATOR

void CountAllocation(const volatile void*, std::size_t) {
  if (t_counting) ++t_allocations;
}
void IgnoreFree(const volatile void*) {}
[[maybe_unused]] const int kHooksInstalled =
    __sanitizer_install_malloc_and_free_hooks(CountAllocation, IgnoreFree);

}  // namespace

#else

void* CountedAllocate(std::size_t n, std::size_t alignment = 0) {
  if (t_counting) ++t_allocations;
  if (n == 0) n = 1;
  void* p = alignment == 0 ? std::malloc(n)
                           : std::aligned_alloc(alignment, (n + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return CountedAllocate(n); }
void* operator new[](std::size_t n) { return CountedAllocate(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  return CountedAllocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return CountedAllocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

#endif  // SIWX_SANITIZER_ALLOCATOR

namespace siwx::engine::testing {
namespace {

constexpr std::size_t kMessage = std::size_t{64} << 10;
constexpr std::size_t kOutstanding = 128;  // perftest's default tx depth
constexpr std::size_t kSignalEvery = 16;
constexpr std::size_t kWarmUp = 2048;
constexpr std::size_t kCounted = 3072;
// Every count ends with a signalled message, so that Stream sees it complete.
static_assert(kWarmUp % kSignalEvery == 0 && kCounted % kSignalEvery == 0);
// Sends the receiver has not reaped yet, below its receive queue's depth
// (an iWARP Send that finds no receive is fatal to the stream).
constexpr std::size_t kSendCredits = 192;
constexpr std::size_t kReceiveDepth = 256;  // NodeOptions' RQ depth

// Allocations of the calling thread while it runs `fn`.
template <typename F>
std::size_t AllocationsDuring(F&& fn) {
  t_allocations = 0;
  t_counting = true;
  fn();
  t_counting = false;
  return t_allocations;
}

class PostingThreadAllocationTest : public ::testing::TestWithParam<SendOpcode> {
 protected:
  void SetUp() override {
    Link(a_, b_, Transport::kTcp, LinkOptions{});
    source_.Fill(7);
    lkey_ = source_.Register(a_.memory(), a_.pd, kAllRemote);
    rkey_ = sink_.Register(b_.memory(), b_.pd, kAllRemote);
    wr_ = MakeSend(0, GetParam(), 0);
    AddSge(wr_, source_.addr(), kMessage, lkey_);
    wr_.rkey = rkey_;
    wr_.remote_addr = sink_.addr();
    receive_ = ReceiveWorkRequest{};
    AddSge(receive_, sink_.addr(), kMessage, rkey_);
    if (GetParam() == SendOpcode::kSend) {
      while (receives_ < kReceiveDepth && b_.qp->PostRecv(receive_) == PostStatus::kOk) ++receives_;
      ASSERT_EQ(receives_, kReceiveDepth);
    }
  }
  void TearDown() override {
    stop_.store(true);
    if (receiver_.joinable()) receiver_.join();
  }

  // Holds b's progress thread while a posts kOutstanding messages and polls
  // for a while: TCP backs up and a frames as far ahead as its transmit ring
  // allows, so every slot the stream can use exists before anything is
  // counted. Then starts b's application (Sends).
  void FillTheTransmitRing() {
    {
      ProgressThreadBlocker blocker(b_, a_.engine);
      ASSERT_TRUE(blocker.Block());
      PostAhead(kOutstanding);
      std::array<WorkCompletion, 16> wc;
      const auto until = Clock::now() + std::chrono::milliseconds(50);
      while (Clock::now() < until) Reap(a_.send_cq->PollWithProgress(wc), wc);
    }
    if (GetParam() == SendOpcode::kSend) receiver_ = std::thread([this] { Receive(); });
  }

  // b's application: keeps receives posted and reaps their completions.
  void Receive() {
    std::array<WorkCompletion, 32> wc;
    while (!stop_.load(std::memory_order_relaxed)) {
      while (receives_ < kReceiveDepth && b_.qp->PostRecv(receive_) == PostStatus::kOk) ++receives_;
      const std::size_t got = b_.recv_cq->PollWithProgress(wc);
      receives_ -= got;
      received_.fetch_add(got, std::memory_order_release);
    }
  }

  // Posts until `limit` messages are outstanding (or the receiver's credits
  // or the message count `last` run out).
  void PostAhead(std::size_t limit, std::size_t last = SIZE_MAX) {
    const bool sends = GetParam() == SendOpcode::kSend;
    while (posted_ - completed_ < limit && posted_ < last &&
           (!sends || posted_ - received_.load(std::memory_order_acquire) < kSendCredits)) {
      wr_.wr_id = posted_;
      wr_.flags = (posted_ + 1) % kSignalEvery == 0 ? std::uint32_t{kSendSignaled} : 0u;
      if (a_.qp->PostSend(wr_) != PostStatus::kOk) break;
      ++posted_;
    }
  }

  void Reap(std::size_t got, const std::array<WorkCompletion, 16>& wc) {
    for (std::size_t i = 0; i < got; ++i) {
      if (wc[i].status != WcStatus::kSuccess) failures_++;
      completed_ = wc[i].wr_id + 1;
    }
  }

  // a's application: `count` messages of 64 KiB, at most kOutstanding posted
  // and not complete, every kSignalEvery-th signalled, as perftest streams.
  // Messages already outstanding count towards `count`.
  void Stream(std::size_t count) {
    std::array<WorkCompletion, 16> wc;
    const auto deadline = Clock::now() + kWait;
    while (completed_ - first_ < count && Clock::now() < deadline) {
      PostAhead(kOutstanding, first_ + count);
      Reap(a_.send_cq->PollWithProgress(wc), wc);
    }
    const bool finished = completed_ - first_ >= count;
    EXPECT_TRUE(finished) << completed_ - first_ << " of " << count << " completed";
    first_ = completed_;
  }

  Node a_;
  Node b_;
  Buffer source_{kMessage};
  Buffer sink_{kMessage};
  std::uint32_t lkey_ = 0;
  std::uint32_t rkey_ = 0;
  SendWorkRequest wr_;
  ReceiveWorkRequest receive_;
  std::size_t receives_ = 0;  // posted at b, not complete (b's application)
  std::thread receiver_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> received_{0};  // Sends b has reaped
  std::size_t posted_ = 0;
  std::size_t completed_ = 0;
  std::size_t first_ = 0;
  std::size_t failures_ = 0;
};

std::unique_ptr<std::uint64_t> g_kept;  // an allocation the compiler cannot elide

TEST_P(PostingThreadAllocationTest, AStreamAllocatesNothingPerMessageOnThePostingThread) {
  // The count sees this thread's allocations at all.
  ASSERT_EQ(AllocationsDuring([] { g_kept = std::make_unique<std::uint64_t>(1); }), 1u);
  FillTheTransmitRing();
  Stream(kWarmUp);
  const std::size_t allocations = AllocationsDuring([&] { Stream(kCounted); });
  EXPECT_EQ(failures_, 0u);
  // Zero: any fixed number per message would show as thousands here.
  EXPECT_EQ(allocations, 0u) << "over " << kCounted << " messages";
}

INSTANTIATE_TEST_SUITE_P(Opcodes, PostingThreadAllocationTest,
                         ::testing::Values(SendOpcode::kRdmaWrite, SendOpcode::kSend),
                         [](const ::testing::TestParamInfo<SendOpcode>& param) {
                           return std::string(param.param == SendOpcode::kSend ? "Send" : "Write");
                         });

// SigBlk of the thread `tid` of this process, as /proc shows it.
std::optional<std::uint64_t> BlockedSignalsOf(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return std::nullopt;
}

bool Has(std::uint64_t set, int signal) { return (set >> (signal - 1)) & 1; }

TEST(ServiceThreadSignalsTest, TheProgressThreadBlocksTheApplicationsSignalsButNotFaults) {
  // Blocked here too, so the thread could not inherit the answer.
  sigset_t none;
  sigemptyset(&none);
  sigset_t saved;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &none, &saved), 0);
  Node node;
  ASSERT_TRUE(WaitUntil([&] { return node.engine->progress_thread_tid() != 0; }));
  const std::optional<std::uint64_t> blocked = BlockedSignalsOf(node.engine->progress_thread_tid());
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  ASSERT_TRUE(blocked.has_value());
  for (int s : {SIGALRM, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE, SIGIO,
                SIGPROF, SIGRTMIN, SIGRTMAX}) {
    EXPECT_TRUE(Has(*blocked, s)) << "signal " << s << " is not blocked";
  }
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) {
    EXPECT_FALSE(Has(*blocked, s)) << "fault signal " << s << " is blocked";
  }
}

}  // namespace
}  // namespace siwx::engine::testing
