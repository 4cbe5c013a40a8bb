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
cm_library=build/release/rdmacm-ext/librdmacm-siwx.so
if [ ! -f "$cm_library" ]; then
  # The device is there; unmodified applications still need QPs and the
  # connection manager.
  "$launcher" ibv_devinfo -d siwx_lo
  cat >&2 <<'MSG'
siwx: the device is attached (above), but it cannot run an application yet:
the provider's QP verbs and the rdma_cm connection manager have not landed.
What works today: scripts/run-tests.sh, `build/release/kernel-shim/siwx-run
ibv_devinfo -v`, and the wire benchmark build/release/benchmarks/wire_bench.
MSG
  exit 69
fi

port=$((20000 + RANDOM % 20000))
"$launcher" -- ib_write_bw -R -d siwx_lo -p "$port" >/tmp/siwx-main-server.log 2>&1 &
server=$!
sleep 1
"$launcher" -- ib_write_bw -R -d siwx_lo -p "$port" 127.0.0.1
wait "$server"
