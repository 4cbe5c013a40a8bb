// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Names for the threads siwx starts inside an application, so that `top -H`,
// `ps -L`, gdb and perf show which part of siwx a thread belongs to (they
// otherwise carry the application's name).
#pragma once

#include <pthread.h>

namespace siwx::util {

// `name` must fit the kernel's 15 characters; a longer one is left unset.
inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace siwx::util
