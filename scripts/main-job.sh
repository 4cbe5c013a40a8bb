#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# The main job: build siwx and run an unmodified RDMA application, perftest's
# ib_write_bw over rdma_cm (-R), between two processes on the siwx_lo device
# of this machine, printing its result. rping follows as a second check.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/install-deps.sh
cmake --preset release >/dev/null
ninja -C build/release

run=build/release/kernel-shim/siwx-run
port=$((20000 + RANDOM % 20000))
server_log=$(mktemp)
trap 'rm -f "$server_log"' EXIT

echo "== ib_write_bw -R over siwx_lo (server and client on 127.0.0.1:$port)"
timeout 120 "$run" -- ib_write_bw -R -d siwx_lo -p "$port" >"$server_log" 2>&1 &
server=$!
sleep 1
status=0
timeout 120 "$run" -- ib_write_bw -R -d siwx_lo -p "$port" 127.0.0.1 || status=$?
wait "$server" || status=$?
if [ "$status" -ne 0 ]; then
  echo "siwx: ib_write_bw failed (exit $status); the server side said:" >&2
  cat "$server_log" >&2
  exit "$status"
fi

echo "== rping -C 10 -v over siwx_lo"
port=$((port + 1))
timeout 60 "$run" -- rping -s -a 127.0.0.1 -p "$port" -C 10 >"$server_log" 2>&1 &
server=$!
sleep 1
timeout 60 "$run" -- rping -c -a 127.0.0.1 -p "$port" -C 10 -v -S 64 || status=$?
wait "$server" || status=$?
if [ "$status" -ne 0 ]; then
  echo "siwx: rping failed (exit $status); the server side said:" >&2
  cat "$server_log" >&2
fi
exit "$status"
