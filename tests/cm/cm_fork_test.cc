// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// fork() with siwx connections open (issue 9 item 10; rdmacm-ext/README.md,
// "fork()"). The child inherits the descriptors of every stream; the
// parent's connections must keep working whatever the child does with them
// (exit, close every descriptor, exec), and no siwx descriptor may survive
// an exec. Needs a device: runs under siwx-run (ctest cm_with_devices).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "tests/cm/cm_test_util.h"

namespace siwx::cm::test {
namespace {

// The descriptors the process inherited (from the shell, ctest, ...),
// noted before main; only those may lack close-on-exec.
const std::vector<int>& InheritedFds() {
  static const std::vector<int> fds = [] {
    std::vector<int> v;
    for (int fd = 0; fd < 1024; ++fd) {
      if (fcntl(fd, F_GETFD) >= 0) v.push_back(fd);
    }
    return v;
  }();
  return fds;
}
[[maybe_unused]] const bool kNoteInheritedFds = !InheritedFds().empty();

enum class ChildDoes { kExit, kCloseAllAndExit, kExec, kUseTheCm, kUseTheQp, kDestroyIt };

std::string Name(ChildDoes c) {
  switch (c) {
    case ChildDoes::kExit: return "Exit";
    case ChildDoes::kCloseAllAndExit: return "CloseAllAndExit";
    case ChildDoes::kExec: return "Exec";
    case ChildDoes::kUseTheCm: return "UseTheCm";
    case ChildDoes::kUseTheQp: return "UseTheQp";
    case ChildDoes::kDestroyIt: return "DestroyWhatItInherited";
  }
  return "?";
}

class CmDeviceFork : public LeakCheck, public ::testing::WithParamInterface<ChildDoes> {
 protected:
  void SetUp() override {
    if (auto why = MissingSiwxDevice(/*needs_stream_binding=*/true)) GTEST_SKIP() << *why;
    LeakCheck::SetUp();
    l_.Start();
    c_.Resolve(l_.port);
    ibv_qp_init_attr attr = QpAttr();
    ASSERT_EQ(rdma_create_qp(c_.id, nullptr, &attr), 0) << "errno " << errno;
    ASSERT_EQ(c_.Connect(), 0);
    server_ = Expect(l_.channel, RDMA_CM_EVENT_CONNECT_REQUEST).id;
    ASSERT_NE(server_, nullptr);
    ibv_qp_init_attr sattr = QpAttr();
    ASSERT_EQ(rdma_create_qp(server_, nullptr, &sattr), 0) << "errno " << errno;
    ASSERT_EQ(rdma_accept(server_, nullptr), 0);
    Expect(l_.channel, RDMA_CM_EVENT_ESTABLISHED);
    Expect(c_.channel, RDMA_CM_EVENT_ESTABLISHED);
    const int access = IBV_ACCESS_LOCAL_WRITE;
    out_mr_ = ibv_reg_mr(c_.id->pd, out_.data(), out_.size(), access);
    in_mr_ = ibv_reg_mr(server_->pd, in_.data(), in_.size(), access);
    ASSERT_NE(out_mr_, nullptr);
    ASSERT_NE(in_mr_, nullptr);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    if (server_ != nullptr) {
      rdma_destroy_qp(server_);
      EXPECT_EQ(rdma_destroy_id(server_), 0);
    }
    if (out_mr_ != nullptr) ibv_dereg_mr(out_mr_);
    if (in_mr_ != nullptr) ibv_dereg_mr(in_mr_);
    rdma_destroy_qp(c_.id);
    c_.Stop();
    l_.Stop();
    ExpectNoLeaks();
  }
  static ibv_qp_init_attr QpAttr() {
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = kMessages;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    return attr;
  }

  // kMessages Sends of kSize octets from the client to the server, each
  // octet checked.
  void TransferAndCheck(std::uint8_t seed) {
    for (std::size_t i = 0; i < out_.size(); ++i) {
      out_[i] = static_cast<std::uint8_t>(seed + i * 31 + i / 251);
    }
    std::fill(in_.begin(), in_.end(), 0);
    for (int m = 0; m < kMessages; ++m) {
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(in_.data() + m * kSize), kSize, in_mr_->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = static_cast<std::uint64_t>(m);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_recv(server_->qp, &wr, &bad), 0);
    }
    for (int m = 0; m < kMessages; ++m) {
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(out_.data() + m * kSize), kSize, out_mr_->lkey};
      ibv_send_wr wr{};
      wr.wr_id = static_cast<std::uint64_t>(m);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(c_.id->qp, &wr, &bad), 0);
    }
    auto poll_all = [](ibv_cq* cq, int n) {
      int done = 0;
      const bool ok = WaitFor(
          [&] {
            ibv_wc wc{};
            while (ibv_poll_cq(cq, 1, &wc) == 1) {
              EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
              ++done;
            }
            return done == n;
          },
          10000ms);
      EXPECT_TRUE(ok) << done << " of " << n << " completions";
    };
    poll_all(c_.id->send_cq, kMessages);
    poll_all(server_->recv_cq, kMessages);
    EXPECT_EQ(in_, out_) << "the parent's stream lost or changed octets";
  }

  // In a child: destroys every verbs object it inherited, as a cleanup
  // would. Each call must succeed at once and touch nothing of the
  // parent's (providers/siwx/provider.h, fork()).
  bool DestroyWhatWasInherited() {
    bool ok = ibv_dereg_mr(out_mr_) == 0 && ibv_dereg_mr(in_mr_) == 0;
    for (rdma_cm_id* id : {c_.id, server_}) {
      ok = ok && ibv_destroy_qp(id->qp) == 0 && ibv_destroy_cq(id->send_cq) == 0 &&
           (id->recv_cq == id->send_cq || ibv_destroy_cq(id->recv_cq) == 0) &&
           ibv_dealloc_pd(id->pd) == 0;
    }
    return ok && ibv_close_device(c_.id->verbs) == 0;
  }

  // Waits for the child; a child stuck on a lock, or waiting for a thread,
  // it inherited would never exit.
  static void ExpectChildExitsCleanly(pid_t child) {
    int status = 0;
    const bool exited =
        WaitFor([&] { return waitpid(child, &status, WNOHANG) == child; }, 10000ms);
    if (!exited) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
    }
    ASSERT_TRUE(exited) << "the child hung";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }

  static constexpr int kMessages = 16;
  static constexpr std::uint32_t kSize = 4096;
  Listener l_;
  Client c_;
  rdma_cm_id* server_ = nullptr;
  std::vector<std::uint8_t> out_ = std::vector<std::uint8_t>(kMessages * kSize);
  std::vector<std::uint8_t> in_ = std::vector<std::uint8_t>(kMessages * kSize);
  ibv_mr* out_mr_ = nullptr;
  ibv_mr* in_mr_ = nullptr;
};

// Every descriptor siwx holds (sockets, eventfds, epoll, the provider's
// socketpairs, the shim's) is close-on-exec: an exec'd child keeps none.
TEST_F(CmDeviceFork, EveryDescriptorIsCloseOnExec) {
  if (IsSkipped()) return;
  const std::vector<int>& inherited = InheritedFds();
  for (int fd = 3; fd < 1024; ++fd) {
    const int flags = fcntl(fd, F_GETFD);
    if (flags < 0) continue;
    if (std::find(inherited.begin(), inherited.end(), fd) != inherited.end()) continue;
    char path[64];
    char target[256] = {};
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    (void)readlink(path, target, sizeof(target) - 1);
    EXPECT_NE(flags & FD_CLOEXEC, 0) << "fd " << fd << " (" << target << ") survives exec";
  }
}

TEST_P(CmDeviceFork, ParentKeepsItsConnectionWhateverTheChildDoes) {
  if (IsSkipped()) return;
  TransferAndCheck(1);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "errno " << errno;
  if (child == 0) {
    // Only async-signal-safe calls here, then _exit: the child has none of
    // the parent's threads.
    switch (GetParam()) {
      case ChildDoes::kExit: break;
      case ChildDoes::kCloseAllAndExit:
        for (int fd = 3; fd <= 1024; ++fd) close(fd);
        break;
      case ChildDoes::kExec: {
        // No environment: siwx-run's LD_PRELOAD (a sanitizer build's
        // libraries) would not load into /bin/true.
        char* const no_env[] = {nullptr};
        execle("/bin/true", "true", static_cast<char*>(nullptr), no_env);
        _exit(5);
      }
      case ChildDoes::kUseTheCm: {
        // The parent's ids are not the child's: refused, and nothing of
        // the parent's connection is touched.
        const bool refused = rdma_disconnect(server_) == -1 && errno == EINVAL &&
                             rdma_disconnect(c_.id) == -1 && errno == EINVAL;
        _exit(refused ? 0 : 3);
      }
      case ChildDoes::kUseTheQp: {
        // The parent's QP and CQ: EPERM, and nothing goes on its stream.
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(out_.data()), kSize, out_mr_->lkey};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        ibv_send_wr* bad = nullptr;
        ibv_wc wc{};
        const bool refused = ibv_post_send(c_.id->qp, &wr, &bad) == EPERM && bad == &wr &&
                             ibv_poll_cq(server_->recv_cq, 1, &wc) < 0;
        _exit(refused ? 0 : 4);
      }
      case ChildDoes::kDestroyIt:
        _exit(DestroyWhatWasInherited() ? 0 : 6);
    }
    _exit(0);
  }
  ExpectChildExitsCleanly(child);
  if (HasFatalFailure()) return;
  TransferAndCheck(2);
  TransferAndCheck(3);
  // Neither end saw its connection end.
  EXPECT_FALSE(NextEvent(l_.channel, 200ms).has_value());
  EXPECT_FALSE(NextEvent(c_.channel, 200ms).has_value());
  EXPECT_EQ(Info(server_).stream_bound, 1u);
}

// fork() in the middle of traffic and of memory registrations: at that
// instant a thread of the parent may hold a region for a copy, or the
// memory table's lock, and the child has neither the thread nor a way to
// wait for it. The child's destroys return at once all the same (before
// this was handled, an rsocket child's ibv_dereg_mr waited forever for the
// parent's progress thread to let go of its receive ring).
TEST_F(CmDeviceFork, ChildDestroysWhileTheParentIsBusy) {
  if (IsSkipped()) return;
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    for (std::uint8_t seed = 10; !stop.load() && !HasFailure(); ++seed) TransferAndCheck(seed);
  });
  std::thread registrations([&] {
    std::vector<std::uint8_t> scratch(4096);
    const int access = IBV_ACCESS_LOCAL_WRITE;
    while (!stop.load()) {
      ibv_mr* mr = ibv_reg_mr(c_.id->pd, scratch.data(), scratch.size(), access);
      if (mr != nullptr) ibv_dereg_mr(mr);
    }
  });
  constexpr int kForks = 40;
  for (int i = 0; i < kForks && !HasFailure(); ++i) {
    const pid_t child = fork();
    if (child == 0) _exit(DestroyWhatWasInherited() ? 0 : 6);
    EXPECT_GE(child, 0) << "errno " << errno;
    if (child > 0) ExpectChildExitsCleanly(child);
  }
  stop = true;
  traffic.join();
  registrations.join();
  TransferAndCheck(99);
  EXPECT_FALSE(NextEvent(l_.channel, 200ms).has_value());
  EXPECT_FALSE(NextEvent(c_.channel, 200ms).has_value());
}

INSTANTIATE_TEST_SUITE_P(CmDevice, CmDeviceFork,
                         ::testing::Values(ChildDoes::kExit, ChildDoes::kCloseAllAndExit,
                                           ChildDoes::kExec, ChildDoes::kUseTheCm,
                                           ChildDoes::kUseTheQp, ChildDoes::kDestroyIt),
                         [](const ::testing::TestParamInfo<ChildDoes>& p) {
                           return Name(p.param);
                         });

}  // namespace
}  // namespace siwx::cm::test
