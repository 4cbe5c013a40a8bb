#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Connection setup and teardown rate (issue 10: >= 2,000 per second):
# rdma-core's cmtime with both ends under siwx-run on loopback, N rounds,
# printing each round's per-connection steps and the median of the totals.
#
#   benchmarks/cmtime_rate.sh [--rounds N] [--connections C] [--siwx-run PATH]
#
# As root, each round runs in a network namespace of its own: connections
# closed by earlier rounds (or anything else) leave their ports in TIME_WAIT
# for a minute, and once most of the ephemeral range is taken every
# rdma_resolve_addr's port-0 bind slows down (docs/performance-notes.md
# 3.25), which would measure the machine's history rather than siwx.
set -euo pipefail

rounds=3
connections=1000
here=$(cd "$(dirname "$0")/.." && pwd)
siwx_run=$here/build/release/kernel-shim/siwx-run

while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --siwx-run) siwx_run=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--connections C] [--siwx-run PATH]" >&2; exit 2 ;;
  esac
done
command -v cmtime > /dev/null || { echo "cmtime is not installed (rdmacm-utils; scripts/install-deps.sh installs it)" >&2; exit 2; }
[ -x "$siwx_run" ] || { echo "$siwx_run not found: build first (cmake --preset release && ninja -C build/release) or pass --siwx-run" >&2; exit 2; }

isolate=()
if [ "$(id -u)" = 0 ] && unshare -n true 2> /dev/null; then
  isolate=(unshare -n)
else
  echo "note: not root, so rounds share this network namespace (see the header of $0)" >&2
fi

# One round: server and client on 127.0.0.1, port $1; prints cmtime's table.
one_round() {
  "${isolate[@]}" bash -c '
    siwx_run=$1; connections=$2; port=$3
    ip link set lo up 2> /dev/null || true
    "$siwx_run" -- cmtime -p "$port" -c "$connections" > /dev/null 2>&1 &
    server=$!
    sleep 0.5
    timeout 120 "$siwx_run" -- cmtime -s 127.0.0.1 -p "$port" -c "$connections"
    status=$?
    kill "$server" 2> /dev/null; wait "$server" 2> /dev/null
    exit $status' _ "$siwx_run" "$connections" "$1"
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "cmtime -c $connections on loopback, $rounds rounds ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in $(seq 1 "$rounds"); do
  # A namespace of its own has every port free; a shared one may not.
  port=7471
  if [ ${#isolate[@]} -eq 0 ]; then port=$((20000 + RANDOM % 10000)); fi
  table=$(one_round "$port") || { echo "round $r: cmtime failed" >&2; echo "$table" >&2; exit 1; }
  # The last column is microseconds per connection for each step.
  echo "$table" | awk -v r="$r" -v out="$results" '
    /^(create id|resolve addr|resolve route|create qp|connect|disconnect|destroy)/ {
      split($0, parts, ":"); step = parts[1]; gsub(/ +$/, "", step)
      n = split(parts[2], f, " "); us[step] = f[n]; total += f[n]
    }
    END {
      printf "round %d: %.0f us/conn (%.0f/s)  resolve addr %.0f  connect %.0f  disconnect %.0f\n",
             r, total, 1e6 / total, us["resolve addr"], us["connect"], us["disconnect"]
      print total >> out
    }'
done
sort -n "$results" | awk '{ t[NR] = $1 }
  END {
    m = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "median: %.0f us/conn = %.0f connections/s (sum of the steps; the goal is >= 2,000/s)\n", m, 1e6 / m
  }'
