// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// SIWX_TSAN is defined when this translation unit is built with
// ThreadSanitizer (g++ says so with __SANITIZE_THREAD__, clang with
// __has_feature), for the few places that tell it about orders it cannot see.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define SIWX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIWX_TSAN 1
#endif
#endif
