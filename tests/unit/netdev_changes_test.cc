// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// shim::AddressChanges against the kernel's own notifications: a link change
// made in a private network namespace (so the host's interfaces are never
// touched) must be reported by the next call, and nothing else.
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "kernel-shim/netdev.h"

namespace siwx::shim {
namespace {

constexpr int kNoNamespace = 77;  // the child could not make one: skip

bool SetLoopbackUp() {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq req{};
  std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ioctl(fd, SIOCGIFFLAGS, &req) == 0;
  req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP);
  ok = ok && ioctl(fd, SIOCSIFFLAGS, &req) == 0;
  close(fd);
  return ok;
}

// Runs in a forked child; the exit code names the first step that failed.
int CheckInFreshNamespace() {
  if (unshare(CLONE_NEWNET) != 0) return kNoNamespace;
  AddressChanges changes;
  if (!changes.ChangedSinceLastCall()) return 1;  // the first call knows nothing yet
  if (changes.ChangedSinceLastCall()) return 2;   // nothing happened since
  if (!SetLoopbackUp()) return 3;
  if (!changes.ChangedSinceLastCall()) return 4;  // lo went up: RTNLGRP_LINK (and its addresses)
  if (changes.ChangedSinceLastCall()) return 5;   // drained
  return 0;
}

TEST(AddressChanges, ReportsALinkChangeMadeBeforeTheCallAndNothingElse) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(CheckInFreshNamespace());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kNoNamespace) GTEST_SKIP() << "no network namespace (not root?)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed at step " << WEXITSTATUS(status)
                                    << " of CheckInFreshNamespace";
}

TEST(AddressChanges, AForkedChildStartsAfresh) {
  AddressChanges changes;
  (void)changes.ChangedSinceLastCall();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  // The child must not drain the parent's socket: its first call opens its
  // own and, knowing nothing yet, reports a change.
  if (pid == 0) _exit(changes.ChangedSinceLastCall() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace siwx::shim
