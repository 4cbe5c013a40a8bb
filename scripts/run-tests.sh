#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Runs every siwx test: installs what is missing, then
#  1. a g++ build with warnings as errors: all CTest labels but fuzz and
#     package, the twohost label last and alone (as root it builds two
#     network namespaces and impairs the link between them; skipped without
#     root);
#  2. a clang ASan+UBSan build with the libFuzzer targets: every label but
#     apps, twohost and package (they run uninstrumented Debian tools),
#     fuzzing each target for SIWX_FUZZ_SECONDS (default 60);
#  3. a clang TSan build: the unit, engine, cm and verbs labels (the
#     threaded code, and the provider and CM around it);
#  4. the package label: the .deb installed into a clean Debian 12 root
#     (needs root and network; skipped with the reason printed without).
# Build settings live in CMakePresets.json. Exits non-zero on the first failure.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/install-deps.sh
scripts/install-packaging-deps.sh

jobs=$(nproc)

echo "== build/release (g++, -Werror)"
cmake --preset release >/dev/null
ninja -C build/release -j"$jobs"
(cd build/release && ctest -j"$jobs" --output-on-failure -LE 'fuzz|package|twohost')
echo "== build/release: two hosts (network namespaces, impaired link; root only)"
(cd build/release && ctest --output-on-failure -L twohost)

echo "== build/tsan (clang, TSan): unit, engine, cm and verbs"
cmake --preset tsan >/dev/null
ninja -C build/tsan -j"$jobs"
(cd build/tsan && ctest -j"$jobs" --output-on-failure -L 'unit|engine|cm|verbs')

echo "== build/asan (clang, ASan+UBSan, libFuzzer)"
cmake --preset asan >/dev/null
ninja -C build/asan -j"$jobs"
# The apps, twohost and package labels (uninstrumented Debian tools) run in
# the release build only.
(cd build/asan && ctest -j"$jobs" --output-on-failure -LE 'fuzz|apps|twohost|package')
# Fuzzers one at a time, each for its bounded time; show libFuzzer's totals.
fuzz_log=build/asan/fuzz.log
if ! (cd build/asan && ctest -L fuzz -V) >"$fuzz_log" 2>&1; then
  tail -n 150 "$fuzz_log"
  echo "siwx: a fuzz target failed; the reproducer is in build/asan/tests/fuzz/artifacts/" >&2
  exit 1
fi
grep -E 'Test +#[0-9]+: fuzz|number_of_executed_units|tests passed|tests failed' "$fuzz_log"

echo "== package: the .deb in a clean Debian 12 root (build/release/package-test)"
(cd build/release && ctest -V -L package) | grep -Ev '^(UpdateCTestConfiguration|Parse|Add|Constructing|Checking|Test project|test [0-9]+$)'
