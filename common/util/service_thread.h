// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The threads siwx starts inside an application's process (progress, CM,
// out-of-band connect, netdev monitor, rsocket linger).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <functional>
#include <thread>
#include <utility>

namespace siwx::util {

// A name, so that `top -H`, `ps -L`, gdb and perf show which part of siwx a
// thread belongs to (they otherwise carry the application's name). `name`
// must fit the kernel's 15 characters; a longer one is left unset.
inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

// What a service thread blocks: every signal but the ones its own faults
// raise, which must reach their handlers (a sanitizer's report, a crash
// handler) on the thread that faulted.
inline sigset_t ServiceThreadSignalMask() {
  sigset_t mask;
  sigfillset(&mask);
  for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&mask, fault);
  return mask;
}

// Starts `fn(args...)` on a thread named `name` that blocks the signals of
// ServiceThreadSignalMask from its first instruction (the mask is inherited,
// so it is set around the creation). A process-directed signal (alarm(),
// SIGINT, SIGTERM, SIGCHLD) then always runs the application's handler on
// one of the application's own threads, as it would without siwx. On a siwx
// thread it could interrupt siwx's allocator or locks: perftest's SIGALRM
// handler reads /proc through stdio, which would deadlock there.
template <typename F, typename... Args>
std::thread StartServiceThread(const char* name, F&& fn, Args&&... args) {
  const sigset_t blocked = ServiceThreadSignalMask();
  sigset_t saved;
  pthread_sigmask(SIG_SETMASK, &blocked, &saved);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{saved};
  return std::thread(
      [name](auto&& body, auto&&... body_args) {
        NameThisThread(name);
        std::invoke(std::forward<decltype(body)>(body),
                    std::forward<decltype(body_args)>(body_args)...);
      },
      std::forward<F>(fn), std::forward<Args>(args)...);
}

}  // namespace siwx::util
