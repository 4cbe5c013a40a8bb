#!/usr/bin/env bash
# The main job: build siwx and run an unmodified RDMA application over the
# siwx_lo device on this machine, printing its result.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/install-deps.sh
cmake --preset release >/dev/null
ninja -C build/release

launcher=build/release/kernel-shim/siwx-run
if [ ! -x "$launcher" ]; then
  cat >&2 <<'MSG'
siwx: the device is not ready yet. This build has the iWARP wire layer
(MPA framing, markers, CRC32c, startup negotiation, DDP/RDMAP codecs) and the
engine's verbs objects; the libibverbs provider, the siwx-run launcher and the
connection manager that unmodified applications need have not landed yet.
What works today: scripts/run-tests.sh, and the wire benchmark:
  build/release/benchmarks/wire_bench
MSG
  exit 69
fi

port=$((20000 + RANDOM % 20000))
"$launcher" -- ib_write_bw -R -d siwx_lo -p "$port" >/tmp/siwx-main-server.log 2>&1 &
server=$!
sleep 1
"$launcher" -- ib_write_bw -R -d siwx_lo -p "$port" 127.0.0.1
wait "$server"
